"""``agentnest profiles``: validate the profile file and list its profiles."""

from __future__ import annotations

import argparse

from ..config import format_size
from ..errors import ProfileError
from ..profiles import ENV_VAR, Profile, find_profile_file, load_profiles
from ._output import Commands, add_command, print_table

_EPILOG = f"""\
The file is the one --file names, else ${ENV_VAR}, else ./agentnest.yaml.
The whole file is validated; an error names the file and line (exit code 2).

examples:
  agentnest profiles                      # list the profiles of ./agentnest.yaml
  agentnest profiles --file ci.yaml       # validate another file
  agentnest run --profile strict -- python3 -V
"""


def register(commands: Commands) -> None:
    """Add ``profiles`` to the command line."""
    parser = add_command(
        commands,
        "profiles",
        "validate agentnest.yaml and list its profiles",
        "Load the profile file, validate all of it, and list each profile's main settings.",
        _EPILOG,
    )
    parser.add_argument("--file", metavar="PATH", help="the profile file to read")
    parser.set_defaults(handler=handle)


def _summary(profile: Profile, default: str | None) -> list[str]:
    policy = profile.security_policy
    network = policy.network.mode.value
    if policy.network.domains:
        network += (
            f" ({', '.join(policy.network.domains[:3])}{'...' if len(policy.network.domains) > 3 else ''})"
        )
    limits = []
    if profile.memory is not None:
        limits.append(f"memory {format_size(profile.memory)}")
    if profile.cpus is not None:
        limits.append(f"cpus {profile.cpus:g}")
    if profile.timeout is not None:
        limits.append(f"timeout {profile.timeout:g}s")
    runtime = policy.required_runtime or profile.backend or "-"
    rules = f"{len(profile.approvals)} rules" if profile.approvals else "-"
    name = profile.name + (" (default)" if profile.name == default else "")
    return [name, runtime, network, ", ".join(limits) or "-", rules]


def handle(args: argparse.Namespace) -> int:
    """Print a table of the profiles; a ProfileError propagates (exit 2 with file:line)."""
    path = find_profile_file(args.file)
    if path is None:
        raise ProfileError(f"no profile file: pass --file, set ${ENV_VAR} or create agentnest.yaml here")
    found = load_profiles(path)
    rows = [_summary(found.profiles[name], found.default) for name in sorted(found.profiles)]
    print(f"{path}: {len(rows)} profile{'s' if len(rows) != 1 else ''}, valid")
    if rows:
        print_table(["PROFILE", "RUNTIME", "NETWORK", "LIMITS", "APPROVALS"], rows)
    return 0
