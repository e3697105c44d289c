"""What the kubelet does to a container's strings before it starts it (a test helper, no tests here).

Kubernetes expands `$(VAR)` in a container's command, args and env values ("Define Dependent
Environment Variables"; the API's EnvVar.value: "Variables that reference a $(VAR_NAME) are expanded
using the previous defined environment variables in the container ... If a variable cannot be
resolved, the reference in the input string will be unchanged. The $(VAR_NAME) syntax can be escaped
with a double $$"). The rule, as k8s.io's third_party/forked/golang/expansion applies it, written
here from that description: `$$` is one `$` wherever it stands; `$(NAME)` is NAME's value when NAME
is defined, else left as it is; `$(` with no `)` after it, and `$` before any other character or at
the end, are left as they are. Env values see only the variables defined before them; command and
args see the container's whole env.
"""

from __future__ import annotations

from typing import Any, Mapping


def expand(text: str, defined: Mapping[str, str]) -> str:
    """`text` as the container receives it, given the variables `defined` for it."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and text.find(")", i + 2) >= 0:
            close = text.find(")", i + 2)
            out.append(defined.get(text[i + 2:close], text[i:close + 1]))
            i = close + 1
        else:  # `$x`, or `$(` never closed: as it is
            out.append(text[i:i + 2])
            i += 2
    return "".join(out)


def container_env(container: Mapping[str, Any], from_secrets: Mapping[str, str] | None = None) -> dict[str, str]:
    """The env a pod's container sees: `from_secrets` (envFrom keys) first, then each `env` value expanded
    with the variables defined before it."""
    env = dict(from_secrets or {})
    for item in container.get("env", []):
        env[item["name"]] = expand(item["value"], env)
    return env


def container_args(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The container's command + args as the process gets them (expanded with its whole env)."""
    return [expand(arg, env) for arg in [*container.get("command", []), *container.get("args", [])]]
