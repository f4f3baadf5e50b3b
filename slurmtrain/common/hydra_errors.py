"""Hydra/OmegaConf composition errors, reduced to one line that names the key, value and fix."""

from __future__ import annotations

import re
from typing import Optional

from slurmtrain.common.secrets import redact_overrides


def one_line(err: BaseException) -> Optional[str]:
    """A one-line message for a composition error, or None if `err` is not one."""
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    chain = [err]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)  # type: ignore[arg-type]
    if not any(isinstance(e, (HydraException, OmegaConfBaseException)) for e in chain):
        return None
    text = "\n".join(str(e) for e in chain)
    override = getattr(err, "override", None)
    if override is not None:  # a cluster.env.X=... override is echoed with a reference instead
        override = redact_overrides([str(override)])[0]
    if override is not None and ("Exception" in text or "mismatched input" in text):
        return (
            f"{override.strip()!r}: not a valid override; quote a value with spaces or "
            f"special characters, e.g. key='a value' (for the shell: \"key='a value'\")"
        )
    if isinstance(err, MissingConfigException) or "Could not find '" in text:
        m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
        options = re.findall(r"^\t(\S+)$", text, re.MULTILINE)
        if m:
            return (
                f"{m[1]}={m[2]}: unknown {m[1]}; choose one of {', '.join(options)}"
                if options
                else f"{m[1]}={m[2]}: unknown {m[1]}"
            )
    m = re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]", text)
    key = re.search(r"full_key: (\S+)", text)
    if m and key:  # an Enum field (schema.py): its members are the choices
        choices = m[2].split(", ")
        return (
            f"{key[1]}={m[1]!r}: unknown; choose one of {', '.join(choices)}; "
            f"e.g. {key[1]}={choices[0]}"
        )
    m = re.search(r"Could not override '([^']+)'", text) or re.search(
        r"Key '([^']+)' (?:is not in struct|not in)", text
    )
    if m:
        return f"{m[1]}: unknown key; check the spelling (python -m slurmtrain --cfg job lists all keys)"
    m = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", text)
    if m:
        where = key[1] if key else "a key"
        kind = m[2].lower()
        return f"{where}={m[1]!r}: not a valid {kind}; give {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    m = re.search(r"Interpolation key '([^']+)' not found", text)
    if m and key and key[1].startswith("cluster.env."):  # meant for the shell, at job time
        return (
            f"{key[1]}: ${{{m[1]}}} is Hydra's interpolation; for the job's shell write "
            f"'+{key[1]}=\\${{{m[1]}}}' (or ${m[1]})"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{first} (key: {key[1]})" if key else first
