"""Secrets: config values that are never written in clear, and the redaction of what is recorded.

`cluster.env` is configuration (NCCL_SOCKET_IFNAME, OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK): written
into job.sbatch, config.yaml and the dry run, exported by the batch shell (login/flags.py). The
secrets are an explicit set: the names in `cluster.secrets` (values taken from the submitting
environment), a `cluster.env` entry named like a credential (SECRET_ENV_NAME: WANDB_API_KEY,
HF_TOKEN) or holding a credential-looking value (a token, a URL with a password), and every key
named like a credential (deepspeed.extra.comet.api_key) outside the sections that describe what is
trained. Each is recorded as a reference the job resolves from its environment: `cluster.env.NAME`
as `${oc.env:NAME}`, any other key as `${oc.env:SLURMTRAIN_SECRET_<KEY PATH>}`, `cluster.secrets`
as its names. The values go to RUN_DIR/secrets.env only: mode 0600, written by the submitting
user's own process on the shared filesystem, sourced by job.sbatch (srun hands the variables on to
every rank). config.yaml, overrides.yaml, provenance/, job.sbatch, the dry-run output and Hydra's
own records (a sweep's multirun.yaml, a user's hydra.output_subdir: hydra_plugins/) carry
references or `<redacted>`, never a value. A value typed on the command line still works, with a
warning that `ps` shows it to every user: by name (`cluster.secrets`) is the way.

Model, data, optim and train keys are never secrets, whatever they are called (model.hf_extra's
bos_token_id, pad_token_id; train.tokens): they are what is trained, recorded as values, typed
as written and fingerprinted (two models that differ in a token id are two runs). The fingerprint
is taken over config.yaml's text: a secret's reference (its name), never its value.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
from pathlib import Path
from typing import Iterable, Iterator, Optional

from slurmtrain.common.durable import replace_atomically

# (key path, the dict holding it, its key there) of a secret scalar in a plain container.
Found = tuple[str, dict[str, object], str]

REDACTED = "<redacted>"
ENV_FILE = "secrets.env"
ENV_KEY = "cluster.env"
NAMED_KEY = "cluster.secrets"  # names whose values come from the submitting environment
SECRET_PREFIX = "SLURMTRAIN_SECRET_"
# The job's list of the variables secrets.env set (names only): provenance redacts them all, also
# those whose name or value does not look secret (cluster.env.WANDB_BASE_URL=https://u:pw@host).
NAMES_VAR = "SLURMTRAIN_SECRET_NAMES"
# Sections that are the experiment itself: none of their keys is a secret.
NEVER_SECRET = ("model", "data", "optim", "train")

# Environment variable names whose values are credentials (recorded environments, cluster.env).
SECRET_ENV_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW|API_?KEY|PRIVATE|CREDENTIAL|AUTH|COOKIE|SESSION|ACCESS_KEY|"
    r"(?:^|_)KEY(?:_|$))",
    re.IGNORECASE,
)
# Config keys named like credentials: whole words of the key's last part, so that train.tokens or
# optim.warmup_tokens are not taken for a token.
SECRET_KEY_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|AUTH)(?:_|$)",
    re.IGNORECASE,
)
# Values that look like credentials whatever they are called: tokens of common services, and
# 32-64 hex digits (wandb's 40-hex API key, md5/sha-style secrets). A git SHA in a diff is hidden
# too: a diff is worth less than a leaked key.
SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abpsr]-[A-Za-z0-9-]{10,}|"
    r"wandb_[A-Za-z0-9]{20,}|glpat-[A-Za-z0-9_-]{20,}|(?<![0-9A-Za-z])[0-9a-fA-F]{32,64}(?![0-9A-Za-z]))"
)
# A URL carrying a password (https://user:pw@host): a cluster.env value like that is a secret.
URL_PASSWORD = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Hydra config groups (conf/'s directories): `GROUP=OPTION` chooses a file by its name, never a
# secret (`cluster=slurm` is recorded as given); `cluster={...}`, a dict given whole, still is.
CONFIG_GROUPS = ("cluster", "model", "data", "optim", "deepspeed", "checkpoint", "logger", "site")
GROUP_OPTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@/-]*")


def redact_text(text: str) -> str:
    """`text` with every credential-looking substring replaced by <redacted>."""
    return SECRET_VALUE.sub(REDACTED, text)


def looks_secret(value: object) -> bool:
    """A value that is a credential whatever its key is called (a token, a URL with a password)."""
    text = str(value)
    return bool(SECRET_VALUE.search(text) or URL_PASSWORD.search(text))


def is_secret_key(path: str, value: object = None) -> bool:
    """A config key whose value is a secret: a cluster.env entry named like a credential (or,
    given its value, holding one), or a credential-named key outside NEVER_SECRET's sections.
    Any other cluster.env entry is configuration, written where the job's flags are."""
    if path.startswith(ENV_KEY + "."):
        name = path[len(ENV_KEY) + 1 :]
        return bool(SECRET_ENV_NAME.search(name)) or (value is not None and looks_secret(value))
    if re.split(r"[.\[]", path, maxsplit=1)[0] in NEVER_SECRET:
        return False
    leaf = re.split(r"[.\[\]]", path.rstrip("]"))[-1]
    return bool(SECRET_KEY_NAME.search(leaf))


def env_name(path: str) -> str:
    """The environment variable a secret key's value travels in to the job."""
    if path.startswith(ENV_KEY + "."):
        return path[len(ENV_KEY) + 1 :]
    return SECRET_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_").upper()


def reference(path: str) -> str:
    return "${oc.env:" + env_name(path) + "}"


def secret_keys(node: object, path: str = "") -> Iterable[Found]:
    """(key path, parent dict, key) of every secret scalar under a plain container at `path`."""
    return _walk(node, path)


def _walk(node: object, path: str = "") -> Iterator[Found]:
    """(key path, parent dict, key) of every scalar under a plain container that is a secret."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}" if path else str(key)
            if isinstance(value, (dict, list)):
                yield from _walk(value, here)
            elif value is not None and is_secret_key(here, value):
                yield here, node, key
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def referenced(data: object) -> dict[str, object]:
    """A copy of the config (a DictConfig, a RootConfig or its plain container) with every secret
    as a reference: what config.yaml records and the run's fingerprint is taken of."""
    out = copy.deepcopy(data) if isinstance(data, dict) else _plain(data)
    for path, parent, key in list(_walk(out)):
        parent[key] = reference(path)
    cluster = out.get("cluster")
    env = cluster.get("env") if isinstance(cluster, dict) else None
    if isinstance(env, dict):  # ${VAR} is the shell's, at job time: escaped so that config.yaml
        for key, value in env.items():  # reads back as written
            if isinstance(value, str) and "${" in value and value != reference(f"{ENV_KEY}.{key}"):
                env[key] = kept_literal(value)
    return out


def kept_literal(value: str) -> str:
    """`value` with every `${` escaped for OmegaConf (`\\${`): read back, it is the text itself."""
    return value.replace("${", "\\${")


def _plain(cfg: object) -> dict[str, object]:
    from omegaconf import DictConfig  # only when given a config object: errors load fast

    from slurmtrain.common.schema import RootConfig, plain

    if not isinstance(cfg, (DictConfig, RootConfig)):
        raise TypeError(f"a config (DictConfig or RootConfig) or its plain dict, not {cfg!r:.60}")
    return plain(cfg)


def named(data: dict[str, object]) -> list[str]:
    """The names in cluster.secrets (a plain config)."""
    cluster = data.get("cluster")
    names = cluster.get("secrets") if isinstance(cluster, dict) else None
    return [str(n) for n in names or []]


def check_named(cfg: object, env: Optional[dict[str, str]] = None) -> None:
    """Every cluster.secrets entry is a variable name set in the submitting environment (a
    ConfigError, one line, names the first that is not)."""
    from slurmtrain.common.errors import ConfigError

    data = cfg if isinstance(cfg, dict) else _plain(cfg)
    environ = os.environ if env is None else env
    for name in named(data):
        if not ENV_NAME.fullmatch(name):
            raise ConfigError(f"{NAMED_KEY}: {name!r} is not an environment variable name")
        if name not in environ:
            raise ConfigError(
                f"{NAMED_KEY}: {name} is not set in this shell; export it before submitting "
                f"(its value goes to the run's 0600 secrets.env only)"
            )


def values(cfg: object) -> dict[str, str]:
    """Environment name -> value of every secret in the config (its values, not references) and
    of each cluster.secrets name set in this (the submitting) environment."""
    data = cfg if isinstance(cfg, dict) else _plain(cfg)
    found = {
        env_name(path): str(parent[key])
        for path, parent, key in _walk(data)
        if str(parent[key]) != reference(path)
    }
    for name in named(data):
        if name in os.environ:
            found[name] = os.environ[name]
    return found


def job_environment(cfg: object) -> dict[str, str]:
    """What secrets.env gives the job: the secrets' values and NAMES_VAR listing them."""
    found = values(cfg)
    return {**found, NAMES_VAR: " ".join(sorted(found))} if found else {}


def write_env_file(run_path: Path, cfg: object) -> Optional[Path]:
    """RUN_DIR/secrets.env (0600 whatever the umask, replaced atomically) with the config's
    secrets as `export NAME=value` lines; None (nothing written) when there are none."""
    found = job_environment(cfg)
    if not found:
        return None
    path = Path(run_path) / ENV_FILE
    text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(found.items()))
    replace_atomically(path, text, mode=0o600, exact_mode=True)
    return path


def redacted_yaml(cfg: object) -> str:
    """The config as YAML with references for secrets (the dry run prints this)."""
    from omegaconf import OmegaConf  # the dry run only

    return OmegaConf.to_yaml(OmegaConf.create(referenced(cfg)))


def is_group_choice(key: str, value: str) -> bool:
    """`key=value` chooses a config group's option by name (`cluster=slurm`, `model=opt13b`)."""
    return key in CONFIG_GROUPS and bool(GROUP_OPTION.fullmatch(value)) and not looks_secret(value)


def redact_overrides(args: Iterable[str]) -> list[str]:
    """Command-line overrides (or argv) as recorded: `KEY=VALUE` of a secret key becomes
    `KEY=${oc.env:NAME}`, and token-looking text anywhere is <redacted>."""
    out = []
    for arg in args:
        key, sep, value = str(arg).partition("=")
        bare = key.lstrip("+~")
        if sep and is_group_choice(bare, value):
            out.append(str(arg))
        elif sep and bare in (ENV_KEY, "cluster"):  # the whole dict given at once: none of it
            out.append(f"{key}={REDACTED}")
        elif sep and _KEY_TEXT.fullmatch(bare) and is_secret_key(bare, value):
            out.append(f"{key}={reference(bare)}")
        else:
            out.append(redact_text(str(arg)))
    return out


# The key part of a `KEY=VALUE` override that names a config key (not a dict given whole).
_KEY_TEXT = re.compile(r"[A-Za-z0-9_.\[\]-]+")
_warned: set[str] = set()  # keys warned about in this process: once each, not once a sweep point


def given_in_clear(args: Iterable[str]) -> list[str]:
    """The keys of command-line overrides that give a secret's value itself (`+cluster.env.
    WANDB_API_KEY=abc`), not a reference to the environment (`${oc.env:NAME}`)."""
    found = []
    for arg in args:
        key, sep, value = str(arg).partition("=")
        bare = key.lstrip("+~")
        if not sep or "${" in value or is_group_choice(bare, value):
            continue
        if (_KEY_TEXT.fullmatch(bare) and is_secret_key(bare, value)) or looks_secret(value):
            found.append(bare)
    return found


def warn_given_in_clear(args: Iterable[str]) -> None:
    """One line on stderr per secret given by value on the command line (once per process): it
    still works, but `ps` shows it to every user of the machine while the command runs."""
    import sys

    for key in given_in_clear(args):
        if key in _warned:
            continue
        _warned.add(key)
        if key.startswith(ENV_KEY + "."):
            name = env_name(key)
            how = f"export {name}=... and pass {NAMED_KEY}=[{name}]"
        else:
            how = f"export it (e.g. as MY_SECRET) and pass {key}='${{oc.env:MY_SECRET}}'"
        print(
            f"slurmtrain: warning: {key}: a secret's value on the command line is visible to "
            f"every user of this machine (ps); pass it by name instead: {how}",
            file=sys.stderr,
        )


def redacted_hydra(data: dict[str, object]) -> dict[str, object]:
    """Hydra's record of a command (multirun.yaml: the config as composed, unresolved, and its
    `hydra` section) with every secret as a reference: the config's secret keys, the overrides
    that gave one (hydra.overrides), and every other string holding such an override or value
    (hydra.job.override_dirname joins the overrides)."""
    out = copy.deepcopy(data)
    hydra = out.pop("hydra", None)
    found = list(_walk(out))
    hidden = {str(p[k]) for _, p, k in found if len(str(p[k])) >= 4 and "${" not in str(p[k])}
    for path, parent, key in found:
        parent[key] = reference(path)
    lines: list[tuple[str, str]] = []  # (as given, as recorded) of each override that changed
    overrides = hydra.get("overrides") if isinstance(hydra, dict) else None
    if not isinstance(overrides, dict):
        overrides = {}
    for name, given in overrides.items():
        if isinstance(given, list):
            shown = redact_overrides(str(g) for g in given)
            lines += [(str(a), b) for a, b in zip(given, shown) if str(a) != b]
            overrides[name] = shown
    if hydra is None:
        return out
    return {"hydra": _scrubbed(hydra, lines, hidden), **out}


def _scrubbed(node: object, lines: list[tuple[str, str]], hidden: set[str]) -> object:
    """`node` (plain containers) with each string's secret overrides and values hidden."""
    if isinstance(node, dict):
        return {k: _scrubbed(v, lines, hidden) for k, v in node.items()}
    if isinstance(node, list):
        return [_scrubbed(v, lines, hidden) for v in node]
    if not isinstance(node, str):
        return node
    for given, shown in lines:
        node = node.replace(given, shown)
    for value in hidden:
        node = node.replace(value, REDACTED)
    return redact_text(node)
