"""Location independence: which URL is really read for a shard URL a spec names.

The same dataset spec runs unchanged on a laptop, in a cluster or through a cache:

- rewrite rules `PREFIX=REPLACEMENT` turn one location into another (`s3://ocr/=/data/ocr/`). A PREFIX
  starting with `^` is a regular expression matched at the start of the URL (REPLACEMENT may use
  `\\1`); any other PREFIX is plain text. The first matching rule applies, and the rules are applied
  again to the result until none matches (at most MAX_STEPS times: more is a loop, an error);
- a mirror directory: a local copy of a remote shard, at `MIRROR/<bucket or host>/<path>` (webdataset's
  cache layout, host included), is read instead of the remote object when it exists.

Rules and mirror come, lowest precedence first, from the config file (`$SHARDFLOW_CONFIG`, else
`~/.config/shardflow/config.yaml`: `rewrite: [RULE, ...]`, `mirror: DIR`), the environment
(`SHARDFLOW_REWRITE="RULE;RULE"`, `SHARDFLOW_MIRROR=DIR`) and arguments (`Locator(rewrite=, mirror=)`,
`set_locations()`, `--rewrite` / `--mirror` of the CLI). Rules of all sources apply (arguments first);
the mirror of the highest source wins. `storage.schemes.open_read` applies them, and only it: every
input shard and manifest is read through it; outputs are written through open_write, which does not.
Per-protocol fsspec options (endpoints, credentials) stay with fsspec's own configuration
(`~/.config/fsspec/*.json`, `FSSPEC_<PROTOCOL>_<OPTION>` variables) and storage_options.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

from shardflow.errors import ShardflowError

MAX_STEPS = 16
ENV_REWRITE = "SHARDFLOW_REWRITE"
ENV_MIRROR = "SHARDFLOW_MIRROR"
ENV_CONFIG = "SHARDFLOW_CONFIG"


class LocateError(ShardflowError):
    """A bad rewrite rule, a rewrite that loops, or an unreadable config file."""


@dataclass(frozen=True)
class Rule:
    """One rewrite rule: a plain prefix, or a regular expression (`^...`) matched at the start."""

    prefix: str
    replacement: str
    source: str = "argument"  # where it came from (named in errors)

    @classmethod
    def parse(cls, text: str, source: str = "argument") -> Rule:
        prefix, sep, replacement = str(text).partition("=")
        if not sep or not prefix:
            raise LocateError(f"rewrite rule {text!r} ({source}) is not PREFIX=REPLACEMENT")
        if prefix.startswith("^"):
            try:
                re.compile(prefix)
            except re.error as exc:
                raise LocateError(f"rewrite rule {text!r} ({source}): bad regular expression: {exc}") from None
        return cls(prefix, replacement, source)

    def apply(self, url: str) -> str | None:
        """The rewritten URL, or None when the rule does not match."""
        if self.prefix.startswith("^"):
            match = re.match(self.prefix, url)
            return None if match is None else match.expand(self.replacement) + url[match.end():]
        return self.replacement + url[len(self.prefix):] if url.startswith(self.prefix) else None


@dataclass(frozen=True)
class Locator:
    """Rewrite rules and a mirror directory; `resolve(url)` is the URL really read."""

    rules: tuple[Rule, ...] = ()
    mirror: str | None = None

    def rewrite(self, url: str) -> str:
        """`url` after the rewrite rules (the mirror not applied)."""
        seen = [url]
        for _ in range(MAX_STEPS):
            for rule in self.rules:
                new = rule.apply(url)
                if new is not None and new != url:
                    url = new
                    break
            else:
                return url
            if url in seen:
                break
            seen.append(url)
        chain = " -> ".join(seen + [url])
        raise LocateError(f"rewrite rules loop: {chain[:500]}", url=seen[0])

    def resolve(self, url: str) -> str:
        """The URL to read for `url`: rewritten, then its mirror copy when that file exists."""
        if url == "-" or url.startswith("pipe:"):
            return url
        url = self.rewrite(url) if self.rules else url
        if self.mirror:
            local = mirror_path(self.mirror, url)
            if local is not None and os.path.isfile(local):
                return local
        return url


def mirror_path(mirror: str, url: str) -> str | None:
    """Where `url`'s copy sits in the mirror directory (`MIRROR/<bucket or host>/<path>`); None for
    local files and URLs without a path."""
    if "://" not in url or url.startswith(("file://", "local://")):
        return None
    parts = urlsplit(url)
    path = parts.path.lstrip("/")
    if not path or ".." in path.split("/"):
        return None
    return os.path.join(os.path.expanduser(mirror), parts.netloc, *path.split("/"))


def parse_rules(items: Iterable[str] | str | None, source: str) -> tuple[Rule, ...]:
    """Rules from a list, or from one string of rules separated by ';' or newlines."""
    if items is None:
        return ()
    if isinstance(items, str):
        items = [p for p in re.split(r"[;\n]", items) if p.strip()]
    return tuple(Rule.parse(str(item).strip(), source) for item in items)


_CONFIG_CACHE: dict[tuple[str, float], dict[str, Any]] = {}


def config_path() -> str:
    return os.environ.get(ENV_CONFIG) or os.path.expanduser("~/.config/shardflow/config.yaml")


def read_config(path: str | None = None) -> dict[str, Any]:
    """The config file (`rewrite:` rules, `mirror:` directory); {} when there is none."""
    path = path or config_path()
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        if os.environ.get(ENV_CONFIG) and path == os.environ[ENV_CONFIG]:
            raise LocateError(f"{ENV_CONFIG}={path}: no such file") from None
        return {}
    cached = _CONFIG_CACHE.get((path, mtime))
    if cached is None:
        import yaml

        try:
            with open(path, encoding="utf-8") as f:
                cached = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise LocateError(f"config file {path}: {exc}") from None
        if not isinstance(cached, dict) or set(cached) - {"rewrite", "mirror"}:
            raise LocateError(f"config file {path}: expected a mapping with 'rewrite' and/or 'mirror', "
                              f"got {sorted(cached) if isinstance(cached, dict) else type(cached).__name__}")
        _CONFIG_CACHE[(path, mtime)] = cached
    return cached


_LOCATORS: dict[tuple[Any, ...], Locator] = {}  # by everything current_locator reads (a few entries)


def current_locator(rewrite: Sequence[str] | str | None = None, mirror: str | None = None) -> Locator:
    """The Locator of arguments + environment + config file (see the module docstring).

    Built once per combination of its sources (arguments, variables, the config file's content):
    every input shard asks, and parsing the rules again cost ~20 us of each tiny task."""
    config = read_config()
    given = tuple(rewrite) if isinstance(rewrite, (list, tuple)) else rewrite
    key = (given, mirror, id(config) if config else None,  # read_config keeps what it read: one id per content
           *(os.environ.get(name) for name in (ENV_REWRITE, ENV_MIRROR, ENV_CONFIG, *WDS_REWRITE_ENV)))
    cacheable = given is None or isinstance(given, (str, tuple))
    locator = _LOCATORS.get(key) if cacheable else None
    if locator is None:
        rules = (parse_rules(rewrite, "argument") + parse_rules(os.environ.get(ENV_REWRITE), ENV_REWRITE)
                 + webdataset_rules() + parse_rules(config.get("rewrite"), config_path()))
        chosen = mirror or os.environ.get(ENV_MIRROR) or config.get("mirror")
        locator = Locator(rules, str(chosen) if chosen else None)
        if cacheable:
            if len(_LOCATORS) > 64:
                _LOCATORS.clear()
            _LOCATORS[key] = locator
    return locator


WDS_REWRITE_ENV = ("WDS_REWRITE", "GOPEN_REWRITE")  # webdataset's spelling: PATTERN=REPLACEMENT;...


def webdataset_rules() -> tuple[Rule, ...]:
    """The rules of webdataset's variables, with their meaning: each PATTERN is a regular expression
    matched at the start (webdataset applies `re.sub("^" + PATTERN, ...)`), after $SHARDFLOW_REWRITE."""
    out: list[Rule] = []
    for name in WDS_REWRITE_ENV:
        for text in re.split(r"[;\n]", os.environ.get(name) or ""):
            if text.strip():
                out.append(Rule.parse(text.strip() if text.strip().startswith("^") else "^" + text.strip(), name))
    return tuple(out)


def set_locations(rewrite: Sequence[str] | str | None = None, mirror: str | None = None) -> None:
    """Set rewrite rules and the mirror for this process and the processes it starts (DataLoader
    workers, the processes backend), through the environment variables; None leaves one unchanged,
    an empty value clears it."""
    if rewrite is not None:
        text = rewrite if isinstance(rewrite, str) else ";".join(rewrite)
        parse_rules(text, "set_locations")  # refuse a bad rule now
        os.environ[ENV_REWRITE] = text
    if mirror is not None:
        os.environ[ENV_MIRROR] = mirror


def resolve(url: str) -> str:
    """The URL really read for `url` under the current rules and mirror (what open_read opens)."""
    if url == "-" or url.startswith("pipe:"):
        return url
    return current_locator().resolve(url)
