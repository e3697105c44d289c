"""Storage options: which credentials and endpoints apply to a URL, and keeping secrets out of logs.

`storage_options` is what fsspec passes to a filesystem (s3fs: `key`, `secret`, `endpoint_url`,
`client_kwargs`, ...; gcsfs: `token`, `project`, `endpoint_url`, ...). shardflow accepts it in two
shapes, and a mix of both:

- flat: `{"key": "...", "secret": "...", "client_kwargs": {"endpoint_url": "http://..."}}` applies to
  every URL of the job;
- per prefix: `{"s3://bucket-a": {...}, "s3://": {...}, "gs://": {...}}`. Every prefix that matches a
  URL applies, shorter prefixes first, so the longest prefix wins on conflicts (nested dicts such as
  `client_kwargs` are merged). A prefix matches at a path boundary: `s3://bucket-a` matches
  `s3://bucket-a/x.tar` but not `s3://bucket-ab/x.tar`. Flat keys beside prefixes apply first.

Values of the form `${NAME}` are read from the environment when the options are used
(`options_for`), so a job definition, a run directory or a Kubernetes manifest can carry the
*reference* to a secret (`{"secret": "${AWS_SECRET_ACCESS_KEY}"}`) and never its value. Anything
that is written down (run directory, logs, manifests, error messages) goes through `redact()` first,
which replaces secret-looking values with `'***'` and keeps `${NAME}` references as they are.

Credentials also come from the usual places without any options at all: the environment
(`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `GOOGLE_APPLICATION_CREDENTIALS`, ...), `~/.aws`, and
fsspec's own config (`~/.config/fsspec/*.json`, `FSSPEC_S3_ENDPOINT_URL`-style variables).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"

# Option names whose values are secrets. Matched on the lower-cased name with '-' read as '_'.
_SECRET_EXACT = frozenset({
    "key", "secret", "token", "password", "passwd", "pwd", "credentials", "credential",
    "session_token", "security_token", "aws_session_token", "aws_secret_access_key",
    "aws_access_key_id", "access_key", "access_key_id", "secret_key", "secret_access_key",
    "account_key", "sas_token", "connection_string", "client_secret", "private_key",
    "private_key_id", "api_key", "apikey", "auth", "authorization", "bearer", "signature",
    "refresh_token", "id_token", "access_token", "oauth2_token", "service_account_info",
    "sig", "x_amz_signature", "x_amz_security_token", "x_amz_credential", "x_goog_signature",
    "x_goog_credential",
})
_SECRET_PARTS = ("secret", "token", "password", "passwd", "credential", "private_key", "api_key",
                 "access_key", "account_key", "signature", "authorization")
# gcsfs `token=` values that name a method, not a secret.
_TOKEN_METHODS = frozenset({"anon", "google_default", "cache", "cloud", "browser", None, ""})
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def is_secret_name(name: Any) -> bool:
    """Whether an option / header / query parameter called `name` holds a secret."""
    if not isinstance(name, str):
        return False
    norm = name.strip().lower().replace("-", "_")
    if norm in _SECRET_EXACT:
        return True
    return any(part in norm for part in _SECRET_PARTS)


def is_env_reference(value: Any) -> bool:
    """`${NAME}` (the whole value): a reference to an environment variable, safe to write down."""
    return isinstance(value, str) and _ENV_REF.fullmatch(value.strip()) is not None


# ---------------------------------------------------------------------------------------------
# Resolving options for a URL


def _is_prefix_key(key: Any) -> bool:
    return isinstance(key, str) and "://" in key


def split_options(storage_options: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(flat options, {prefix: options}) of a storage_options value of either shape."""
    if not storage_options:
        return {}, {}
    if not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
    flat: dict[str, Any] = {}
    prefixed: dict[str, dict[str, Any]] = {}
    for key, value in storage_options.items():
        if _is_prefix_key(key):
            if not isinstance(value, Mapping):
                raise TypeError(f"storage_options[{key!r}] must be a dict of options for that prefix")
            prefixed[key] = dict(value)
        else:
            flat[key] = value
    return flat, prefixed


def _prefix_matches(prefix: str, url: str) -> bool:
    if not url.startswith(prefix):
        return False
    if len(url) == len(prefix) or prefix.endswith(("/", "://")):
        return True
    return url[len(prefix)] == "/"


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def options_for(
    url: str, storage_options: Mapping[str, Any] | None = None, *, resolve_env: bool = True
) -> dict[str, Any]:
    """The fsspec options that apply to `url` (flat dict, per-prefix dict, or a mix; see module doc).

    `${NAME}` values are replaced by the environment variable NAME (an unset variable is an error
    that names the variable, never a value). The result is a fresh dict the caller may change.
    """
    flat, prefixed = split_options(storage_options)
    result = _merge({}, flat)
    for prefix in sorted((p for p in prefixed if _prefix_matches(p, url)), key=len):
        result = _merge(result, prefixed[prefix])
    return expand_env(result) if resolve_env else result


def expand_env(obj: Any) -> Any:
    """Replace `${NAME}` inside string values (recursively) by the environment variable NAME."""
    if isinstance(obj, str):
        if "${" not in obj:
            return obj

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise KeyError(f"storage option refers to environment variable {name}, which is not set")
            return os.environ[name]

        return _ENV_REF.sub(sub, obj)
    if isinstance(obj, Mapping):
        return {k: expand_env(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [expand_env(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(expand_env(v) for v in obj)
    return obj


# ---------------------------------------------------------------------------------------------
# CLI: --storage-option k=v


def _parse_value(key: str, text: str) -> Any:
    if is_secret_name(key.rsplit(".", 1)[-1]):
        return text  # a numeric-looking password stays a string
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_storage_option(item: str, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """Add one `--storage-option` to `into` (a new dict when None) and return it.

    Forms: `key=value`, `dotted.key=value` (nested: `client_kwargs.endpoint_url=http://h:9000`),
    and `PREFIX:key=value` to scope it to a URL prefix (`s3://bucket-a:anon=true`,
    `gs://:token=anon`). Values are parsed as JSON when they are valid JSON (`true`, `3`,
    `{"a": 1}`), else kept as strings; values of secret-looking keys always stay strings.
    """
    out = {} if into is None else into
    if "=" not in item:
        raise ValueError(f"storage option {_redact_item(item)!r} is not KEY=VALUE")
    name, _, text = item.partition("=")
    name = name.strip()
    target = out
    if "://" in name:
        scheme_end = name.index("://") + 3
        colon = name.rfind(":", scheme_end)
        if colon < 0:
            raise ValueError(f"storage option {name!r}: write PREFIX:KEY=VALUE to scope it to a URL prefix")
        prefix, name = name[:colon], name[colon + 1 :]
        target = out.setdefault(prefix, {})
        if not isinstance(target, dict):
            raise ValueError(f"storage option prefix {prefix!r} clashes with a plain option")
    parts = [p for p in name.split(".")]
    if not name or any(not p for p in parts):
        raise ValueError(f"storage option {name!r} has an empty key")
    for part in parts[:-1]:
        nxt = target.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ValueError(f"storage option {name!r}: {part!r} is already set to a plain value")
        target = nxt
    target[parts[-1]] = _parse_value(name, text)
    return out


def parse_storage_options(items: Iterable[str]) -> dict[str, Any]:
    """Options from repeated `--storage-option KEY=VALUE` (see parse_storage_option)."""
    out: dict[str, Any] = {}
    for item in items:
        parse_storage_option(item, out)
    return out


def _redact_item(item: str) -> str:
    name, sep, text = item.partition("=")
    return f"{name}={REDACTED}" if sep and is_secret_name(name.rsplit(".", 1)[-1].rsplit(":", 1)[-1]) else item


# ---------------------------------------------------------------------------------------------
# Keeping secrets out of what is written down


def redact(obj: Any) -> Any:
    """A copy of `obj` safe to store in a run directory, a log or a manifest.

    - values under secret-looking keys (key, secret, token, password, credentials, session_token,
      ...; see `is_secret_name`) become '***', except `${NAME}` environment references and
      gcsfs token methods ('anon', 'google_default', 'cloud', ...), which name no secret;
    - URLs inside strings lose their user:password@ part and secret query parameters
      (presigned `X-Amz-Signature`, `sig`, `token`, ...);
    - dicts, lists and tuples are walked; other values are returned as they are.
    """
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if is_secret_name(key) and not _harmless_secret_value(key, value):
                out[key] = REDACTED
            else:
                out[key] = redact(value)
        return out
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_urls(obj)
    return obj


def strip_redacted(obj: Any) -> Any:
    """A copy of `obj` without the entries `redact()` blanked out (values equal to '***').

    For options read back from a run directory (job.pkl): a dropped credential makes the
    filesystem fall back to the worker's own environment (AWS_*, GOOGLE_APPLICATION_CREDENTIALS,
    instance roles) instead of signing with '***'.
    """
    if isinstance(obj, Mapping):
        return {k: strip_redacted(v) for k, v in obj.items() if v != REDACTED}
    if isinstance(obj, list):
        return [strip_redacted(v) for v in obj if v != REDACTED]
    return obj


def _harmless_secret_value(key: str, value: Any) -> bool:
    if value is None or value == "" or is_env_reference(value):
        return True
    if key.lower() == "token" and (isinstance(value, str) or value is None) and value in _TOKEN_METHODS:
        return True
    return isinstance(value, bool)


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_name(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_urls(text: str) -> str:
    """`text` with credentials removed from every URL in it (user:password@, secret query values)."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: _redact_url(m.group(0)), text)


def redact_urls_deep(obj: Any) -> Any:
    """A copy of `obj` (JSON-like: dicts, lists, str) with `redact_urls` applied to every string in it.

    Unlike `redact()` it blanks no value by its name (a sample's "key" is not a secret): it is what the
    run directory applies to every record it writes (plan, markers, failures, errors, summary), so
    `http://user:password@host/...` inputs are written down as `http://***@host/...`.
    """
    if isinstance(obj, str):
        return redact_urls(obj)
    if type(obj) is dict or isinstance(obj, Mapping):  # dict first: the ABC check costs ~1 us a value
        return {k: redact_urls_deep(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_urls_deep(v) for v in obj]
    return obj


def secret_values(storage_options: Any) -> list[str]:
    """Every secret string inside `storage_options` (resolved `${NAME}` references included).

    Used to scrub messages from libraries that might echo a credential back (see `scrub`).
    """
    found: list[str] = []

    def walk(obj: Any, secret: bool) -> None:
        if isinstance(obj, Mapping):
            for key, value in obj.items():
                walk(value, secret or is_secret_name(key))
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                walk(value, secret)
        elif secret and isinstance(obj, str) and obj and obj not in _TOKEN_METHODS:
            value = obj
            if is_env_reference(obj):
                value = os.environ.get(_ENV_REF.fullmatch(obj.strip()).group(1), "")  # type: ignore[union-attr]
            if len(value) >= 4:
                found.append(value)

    walk(storage_options, False)
    return sorted(set(found), key=len, reverse=True)


def scrub(text: str, storage_options: Any = None) -> str:
    """`text` with every secret of `storage_options` and every URL credential replaced by '***'."""
    for value in secret_values(storage_options) if storage_options else ():
        text = text.replace(value, REDACTED)
    return redact_urls(text)
