"""Templates without an engine: validation, the canonical tag, spec files, the recipe, the build loop.

The build loop runs against ``FakeBuildAPI``, a stand-in for the slice of
docker-py's ``APIClient`` it uses (an SDK edge); the real engine is in
tests/integration/test_templates.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import docker.errors
import pytest

import agentnest
from agentnest import templates
from agentnest.cli import image as image_cmd
from agentnest.cli import main
from agentnest.errors import (
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    MissingDependencyError,
    RuntimeNotAvailableError,
    TemplateBaseNotFoundError,
    TemplateBuildError,
)
from agentnest.runtime import registry
from agentnest.secrets import Secret
from agentnest.templates import LABEL, LABEL_BASE, BuildEvent, Template

BASE = "example/base:1"
BASE_ID = "sha256:" + "b" * 64
OTHER_BASE_ID = "sha256:" + "c" * 64


def refused(match: str | None = None) -> AbstractContextManager[pytest.ExceptionInfo[ConfigurationError]]:
    return pytest.raises(ConfigurationError, match=match)


def spec(**changes: Any) -> Template:
    """A template using every field but wheels (which need a directory)."""
    fields: dict[str, Any] = {
        "base_image": BASE,
        "apt_packages": ("jq", "curl"),
        "files": {"/etc/app/a.txt": "alpha", "/opt/app/b.bin": b"\x00\x01"},
        "environment": {"APP_MODE": "strict", "APP_LEVEL": "3"},
        "commands": ("echo one > /opt/one", "echo two > /opt/two"),
    }
    fields.update(changes)
    return Template(**fields)


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    """A directory with two (fake) wheels: their bytes are hashed, never installed here."""
    root = tmp_path / "wheels"
    root.mkdir()
    (root / "alpha-1.0-py3-none-any.whl").write_bytes(b"alpha wheel")
    (root / "beta-2.0-py3-none-any.whl").write_bytes(b"beta wheel")
    (root / "README.txt").write_text("not a wheel: ignored")
    return root


# -- validation -----------------------------------------------------------------------


def test_defaults_build_on_the_default_image() -> None:
    from agentnest.runtime.docker.images import base_image

    template = Template()
    assert template.base_image == base_image()
    assert (template.apt_packages, template.wheels, template.commands) == ((), None, ())
    assert dict(template.files) == {} and dict(template.environment) == {}


def test_template_is_exported_and_frozen() -> None:
    assert agentnest.Template is Template
    template = spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        template.commands = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        template.files["/etc/x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        template.environment["X"] = "y"  # type: ignore[index]


def test_packages_are_sorted_and_deduplicated() -> None:
    template = spec(apt_packages=["zstd", "jq", "jq", "jq=1.6-2.1+deb12u2", "g++", "libc6.1"])
    assert template.apt_packages == ("g++", "jq", "jq=1.6-2.1+deb12u2", "libc6.1", "zstd")


@pytest.mark.parametrize(
    "name",
    ["JQ", "j", "-jq", "--allow-unauthenticated", "jq;rm -rf /", "jq $(id)", "jq$(id)", "jq/x", ".jq"],
)
def test_refuses_names_outside_debian_rules(name: str) -> None:
    with refused("Debian package name"):
        spec(apt_packages=(name,))


@pytest.mark.parametrize("field", ["apt_packages", "pip_packages"])
@pytest.mark.parametrize("name", ["", "  ", "\t"])
def test_refuses_empty_package_names(field: str, name: str) -> None:
    with refused("empty name"):
        spec(**{field: ("jq", name)})


def test_several_names_in_one_string_are_several_packages_as_in_0_3_0() -> None:
    """0.3.0 joined its packages into a shell line, so "git curl" meant two packages."""
    assert spec(apt_packages=("jq  curl\tgit",)).apt_packages == ("curl", "git", "jq")
    assert spec(apt_packages=("jq curl",)) == spec(apt_packages=("curl", "jq"))
    assert spec(pip_packages=("rich click==8.1",)).pip_packages == ("click==8.1", "rich")


@pytest.mark.parametrize("version", ["", "a1", "1;id", "1$x"])
def test_refuses_bad_version_pins(version: str) -> None:
    with refused("invalid version"):
        spec(apt_packages=(f"jq={version}",))


@pytest.mark.parametrize("field", ["apt_packages", "commands"])
def test_a_bare_string_is_not_a_list(field: str) -> None:
    with refused("must be a list or tuple of strings"):
        spec(**{field: "jq"})


def test_list_items_must_be_strings() -> None:
    with refused("must hold strings"):
        spec(apt_packages=("jq", 3))


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("etc/app.conf", "absolute"),
        ("//etc/app.conf", "absolute"),
        ("/etc/../root/x", "not normalised"),
        ("/etc/./x", "not normalised"),
        ("/etc//x", "not normalised"),
        ("/etc/x/", "not normalised"),
        ("/", "not normalised"),
        ("/etc/a\nb", "control character"),
        ("/workspace/data.csv", "mounts fresh"),
        ("/workspace", "mounts fresh"),
        ("/tmp/x", "mounts fresh"),
        ("/proc/x", "mounts fresh"),
    ],
)
def test_refuses_bad_file_paths(path: str, why: str) -> None:
    with refused(why):
        spec(files={path: "x"})


def test_a_path_that_only_starts_like_a_hidden_one_is_fine() -> None:
    assert "/workspaces/x" in spec(files={"/workspaces/x": "x", "/tmpl/y": "y"}).files


def test_a_file_cannot_be_a_directory_of_another() -> None:
    with refused("is a file"):
        spec(files={"/opt/app": "x", "/opt/app/inner": "y"})


def test_file_contents_must_be_str_or_bytes() -> None:
    with refused("content"):
        spec(files={"/etc/x": 3})
    with refused("mapping"):
        spec(files=[("/etc/x", "y")])
    assert spec(files={"/etc/x": bytearray(b"ab")}).files["/etc/x"] == b"ab"


def test_refuses_secrets_in_the_environment_and_says_why() -> None:
    with refused("Secret") as caught:
        spec(environment={"TOKEN": Secret("hunter2")})
    message = str(caught.value)
    assert "image layers" in message
    assert "docker history" in message
    assert "Sandbox(" in message
    assert "hunter2" not in message


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"1X": "v"}, "invalid"),
        ({"A-B": "v"}, "invalid"),
        ({"X": 3}, "must be a str"),
        ({"X": "a\nb"}, "control character"),
        ({"X": "a\x00b"}, "control character"),
        ({"AGENTNEST_X": "v"}, "reserved"),
        ({"PATH": "/opt/bin"}, "set by the sandbox"),
        ({"HOME": "/root"}, "set by the sandbox"),
    ],
)
def test_refuses_bad_environment(env: dict[str, Any], why: str) -> None:
    with refused(why):
        spec(environment=env)


@pytest.mark.parametrize("commands", [("",), ("   ",), ("a\x00b",)])
def test_refuses_empty_or_nul_commands(commands: tuple[str, ...]) -> None:
    with refused("command"):
        spec(commands=commands)


@pytest.mark.parametrize("base", ["", "has space:1", 3])
def test_refuses_bad_base_references(base: Any) -> None:
    with refused("image reference"):
        spec(base_image=base)


def test_wheels_directory_is_checked(tmp_path: Path, wheels: Path) -> None:
    with refused("does not exist"):
        spec(wheels=str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with refused("no .whl files"):
        spec(wheels=str(empty))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "notawheel.whl").write_bytes(b"x")
    with refused("not a wheel file name"):
        spec(wheels=str(bad))
    with refused("directory path"):
        spec(wheels=3)
    # A relative path or a Path is made absolute at construction.
    assert spec(wheels=wheels).wheels == str(wheels)
    assert spec(wheels=os.path.relpath(wheels)).wheels == str(wheels)


# -- the canonical tag ----------------------------------------------------------------


def test_tag_shape() -> None:
    tag = spec().tag_for(BASE_ID)
    repository, _, digest = tag.partition(":")
    assert repository == "agentnest/template"
    assert len(digest) == 12 and int(digest, 16) >= 0
    assert spec().digest(BASE_ID).startswith(digest)


def test_tag_is_pinned_for_a_fixed_spec() -> None:
    """Changing the canonical form changes every tag: bump RECIPE_VERSION when you do."""
    template = Template(base_image=BASE, apt_packages=("jq",), files={"/etc/x": "y"}, commands=("true",))
    assert template.canonical(BASE_ID) == {
        "recipe": 1,
        "base": BASE_ID,
        "apt_packages": ["jq"],
        "wheels": {},
        "installer": None,
        "files": {"/etc/x": "a1fce4363854ff888cff4b8e7875d600c2682390412a8cf79b37d0b11148b0fa"},
        "environment": {},
        "commands": ["true"],
    }
    assert (
        template.tag_for(BASE_ID)
        == "agentnest/template:" + templates.digest_of(template.canonical(BASE_ID))[:12]
    )


def test_same_spec_same_tag_whatever_the_order_of_mappings_and_packages() -> None:
    one = spec(
        apt_packages=("jq", "curl"),
        files={"/etc/app/a.txt": "alpha", "/opt/app/b.bin": b"\x00\x01"},
        environment={"APP_MODE": "strict", "APP_LEVEL": "3"},
    )
    two = spec(
        apt_packages=("curl", "jq", "curl"),
        files={"/opt/app/b.bin": b"\x00\x01", "/etc/app/a.txt": b"alpha"},  # str and its UTF-8 bytes
        environment={"APP_LEVEL": "3", "APP_MODE": "strict"},
    )
    assert one.tag_for(BASE_ID) == two.tag_for(BASE_ID)


def test_same_spec_same_tag_in_another_process(wheels: Path) -> None:
    """No hash randomisation, set order or memory address leaks into the tag."""
    code = textwrap.dedent(
        f"""
        import sys
        from agentnest import Template
        order = sys.argv[1] == "reversed"
        files = {{"/etc/a": "1", "/etc/b": "2", "/opt/c": "3"}}
        env = {{"A": "1", "B": "2", "C": "3"}}
        if order:
            files = dict(reversed(list(files.items())))
            env = dict(reversed(list(env.items())))
        t = Template(base_image={BASE!r}, apt_packages=("jq", "curl")[:: -1 if order else 1],
                     wheels={str(wheels)!r}, files=files, environment=env, commands=("true",))
        print(t.tag_for({BASE_ID!r}))
        """
    )
    tags = set()
    for seed, order in (("1", "forward"), ("2", "reversed"), ("3", "forward")):
        proc = subprocess.run(
            [sys.executable, "-c", code, order],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        tags.add(proc.stdout.strip())
    assert len(tags) == 1
    assert tags.pop().startswith("agentnest/template:")


@pytest.mark.parametrize(
    "change",
    [
        {"apt_packages": ("jq", "curl", "git")},
        {"apt_packages": ("jq",)},
        {"apt_packages": ("jq=1.6-2.1+deb12u2", "curl")},
        {"files": {"/etc/app/a.txt": "ALPHA", "/opt/app/b.bin": b"\x00\x01"}},
        {"files": {"/etc/app/z.txt": "alpha", "/opt/app/b.bin": b"\x00\x01"}},
        {"files": {"/etc/app/a.txt": "alpha"}},
        {"environment": {"APP_MODE": "lenient", "APP_LEVEL": "3"}},
        {"environment": {"APP_MODE": "strict", "APP_LEVEL": "3", "X": ""}},
        {"commands": ("echo two > /opt/two", "echo one > /opt/one")},
        {"commands": ("echo one > /opt/one",)},
    ],
    ids=lambda c: json.dumps(c, default=repr)[:60],
)
def test_any_change_makes_a_new_tag(change: dict[str, Any]) -> None:
    assert spec(**change).tag_for(BASE_ID) != spec().tag_for(BASE_ID)


def test_the_base_image_id_not_its_name_is_in_the_tag() -> None:
    assert spec().tag_for(BASE_ID) != spec().tag_for(OTHER_BASE_ID)
    # Two names for one image are one base.
    assert spec(base_image="another/name:2").tag_for(BASE_ID) == spec().tag_for(BASE_ID)


def test_the_recipe_version_is_in_the_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    before = spec().tag_for(BASE_ID)
    monkeypatch.setattr(templates, "RECIPE_VERSION", templates.RECIPE_VERSION + 1)
    assert spec().tag_for(BASE_ID) != before


def test_wheel_content_not_path_is_in_the_tag(tmp_path: Path, wheels: Path) -> None:
    before = spec(wheels=str(wheels)).tag_for(BASE_ID)
    assert before != spec().tag_for(BASE_ID)
    # Same wheels elsewhere: same tag; files that are not wheels do not count.
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    for wheel in wheels.glob("*.whl"):
        (copy / wheel.name).write_bytes(wheel.read_bytes())
    assert spec(wheels=str(copy)).tag_for(BASE_ID) == before
    # A rebuilt wheel, an added one, a renamed one: new tags.
    (copy / "beta-2.0-py3-none-any.whl").write_bytes(b"beta wheel, rebuilt")
    rebuilt = spec(wheels=str(copy)).tag_for(BASE_ID)
    assert rebuilt != before
    (copy / "gamma-1.0-py3-none-any.whl").write_bytes(b"gamma")
    assert spec(wheels=str(copy)).tag_for(BASE_ID) not in (before, rebuilt)
    (wheels / "alpha-1.0-py3-none-any.whl").rename(wheels / "alpha-1.1-py3-none-any.whl")
    assert spec(wheels=str(wheels)).tag_for(BASE_ID) != before


def test_the_pip_that_installs_wheels_is_in_the_tag(
    tmp_path: Path, wheels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip_a, pip_b = tmp_path / "pip-1.whl", tmp_path / "pip-2.whl"
    pip_a.write_bytes(b"pip one")
    pip_b.write_bytes(b"pip two")
    monkeypatch.setattr(templates, "installer_wheel", lambda: pip_a)
    with_a = spec(wheels=str(wheels)).tag_for(BASE_ID)
    plain = spec().tag_for(BASE_ID)
    monkeypatch.setattr(templates, "installer_wheel", lambda: pip_b)
    assert spec(wheels=str(wheels)).tag_for(BASE_ID) != with_a
    # Without wheels pip is not used, so it does not count.
    assert spec().tag_for(BASE_ID) == plain


def test_equal_specs_are_equal_and_hash_alike() -> None:
    one = spec(environment={"A": "1", "B": "2"}, apt_packages=("jq", "curl"))
    two = spec(environment={"B": "2", "A": "1"}, apt_packages=("curl", "jq"))
    assert one == two and hash(one) == hash(two)
    assert len({one, two, spec(commands=("true",))}) == 2


@pytest.mark.parametrize(
    "name",
    [
        "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "my_pkg-0.1.dev0+local-1-py3-none-any.whl",
        "tiny-1.0-py2.py3-none-any.whl",
    ],
)
def test_real_wheel_names_are_accepted(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"w")
    assert spec(wheels=str(tmp_path)).wheels == str(tmp_path)


# -- spec files -----------------------------------------------------------------------


def write_tool(tmp_path: Path) -> None:
    (tmp_path / "tool.py").write_bytes(b"print('tool')\n")


SPEC_DATA: dict[str, Any] = {
    "base_image": BASE,
    "apt_packages": ["jq"],
    "wheels": "wheels",
    "files": {"/etc/app/prompt.txt": "be brief", "/opt/app/tool.py": {"source": "tool.py"}},
    "environment": {"APP_MODE": "strict"},
    "commands": ["echo hi > /opt/hi"],
}


def expected_template(tmp_path: Path) -> Template:
    return Template(
        base_image=BASE,
        apt_packages=("jq",),
        wheels=str(tmp_path / "wheels"),
        files={"/etc/app/prompt.txt": "be brief", "/opt/app/tool.py": b"print('tool')\n"},
        environment={"APP_MODE": "strict"},
        commands=("echo hi > /opt/hi",),
    )


TOML_SPEC = """\
base_image = "example/base:1"
apt_packages = ["jq"]
wheels = "wheels"
commands = ["echo hi > /opt/hi"]

[files]
"/etc/app/prompt.txt" = "be brief"
"/opt/app/tool.py" = { source = "tool.py" }

[environment]
APP_MODE = "strict"
"""

YAML_SPEC = """\
base_image: example/base:1
apt_packages: [jq]
wheels: wheels
files:
  /etc/app/prompt.txt: be brief
  /opt/app/tool.py: {source: tool.py}
environment:
  APP_MODE: strict
commands:
  - echo hi > /opt/hi
"""


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml", ".yml"])
def test_spec_files_in_every_format_give_the_same_template(
    tmp_path: Path, wheels: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tool(tmp_path)
    text = {".json": json.dumps(SPEC_DATA), ".toml": TOML_SPEC}.get(suffix, YAML_SPEC)
    path = tmp_path / f"template{suffix}"
    path.write_text(text)
    # Paths in the spec are relative to its file, not to the working directory.
    monkeypatch.chdir("/")
    loaded = Template.from_file(path)
    assert loaded == expected_template(tmp_path)
    assert loaded.tag_for(BASE_ID) == expected_template(tmp_path).tag_for(BASE_ID)


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("t.json", "{not json", "not valid JSON"),
        ("t.json", "[1, 2]", "must be a mapping"),
        ("t.json", '{"packages": ["jq"]}', "unknown template key.*'packages'"),
        ("t.json", '{"apt_packages": "jq"}', "must be a list"),
        ("t.json", '{"wheels": 3}', "directory path"),
        ("t.json", '{"files": {"/etc/x": {"source": "missing.txt"}}}', "cannot read"),
        ("t.json", '{"files": {"/etc/x": {"src": "a"}}}', "source"),
        ("t.json", '{"files": ["/etc/x"]}', "table of destination paths"),
        ("t.json", '{"environment": {"TOKEN": 3}}', "must be a str"),
        ("t.toml", "apt_packages = [", "not valid TOML"),
        ("t.yaml", "apt_packages: [jq", "not valid YAML"),
        ("t.ini", "[x]", "unknown spec format '.ini'"),
    ],
)
def test_bad_spec_files_are_refused_clearly(tmp_path: Path, name: str, text: str, why: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with refused(why):
        Template.from_file(path)


def test_a_missing_spec_file(tmp_path: Path) -> None:
    with refused("cannot read template spec"):
        Template.from_file(tmp_path / "nope.json")


def test_toml_without_tomllib_or_tomli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.toml"
    path.write_text(TOML_SPEC)
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(MissingDependencyError, match="tomli") as caught:
        Template.from_file(path)
    assert isinstance(caught.value, ImportError)


def test_yaml_without_pyyaml_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(YAML_SPEC)
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(MissingDependencyError, match=r"agentnest\[profiles\]"):
        Template.from_file(path)


# -- the recipe -----------------------------------------------------------------------


def instructions(dockerfile: str) -> list[str]:
    return [line for line in dockerfile.splitlines() if line and not line.startswith("#")]


def test_dockerfile_runs_each_part_in_order_and_ends_as_the_sandbox_user(wheels: Path) -> None:
    dockerfile, steps = templates.render_dockerfile(spec(wheels=str(wheels)), BASE_ID, installer=True)
    lines = instructions(dockerfile)
    assert len(lines) == len(steps)
    kinds = [line.split(" ", 1)[0] for line in lines]
    assert kinds == [
        "FROM",
        "USER",
        "ARG",
        "RUN",
        "ADD",
        "RUN",
        "ADD",
        "ENV",
        "RUN",
        "RUN",
        "USER",
        "WORKDIR",
    ]
    assert lines[0] == f"FROM {BASE_ID}"  # the ID the tag names, not the moving name
    assert lines[1] == "USER root"
    assert lines[-2:] == ["USER 65532:65532", "WORKDIR /workspace"]
    apt = json.loads(lines[3].removeprefix("RUN "))
    assert apt[:2] == ["/bin/sh", "-c"]
    assert "apt-get update" in apt[2]
    assert "apt-get install -y --no-install-recommends curl jq" in apt[2]
    assert "rm -rf /var/lib/apt/lists/*" in apt[2]
    pip = json.loads(lines[5].removeprefix("RUN "))[2]
    assert "pip install --no-index --find-links" in pip
    assert json.loads(lines[8].removeprefix("RUN ")) == ["/bin/sh", "-c", "echo one > /opt/one"]
    assert steps[3] == "install 2 Debian packages: curl jq"
    assert steps[8] == "run: echo one > /opt/one"


def test_dockerfile_without_packages_or_wheels_has_no_such_steps() -> None:
    dockerfile, _ = templates.render_dockerfile(
        Template(base_image=BASE, commands=("true",)), BASE_ID, installer=False
    )
    assert "ARG" not in dockerfile and "apt-get" not in dockerfile and "ADD" not in dockerfile
    assert instructions(dockerfile) == [
        f"FROM {BASE_ID}",
        "USER root",
        'RUN ["/bin/sh", "-c", "true"]',
        "USER 65532:65532",
        "WORKDIR /workspace",
    ]


def test_environment_values_are_escaped_for_the_dockerfile() -> None:
    template = Template(base_image=BASE, environment={"A": 'say "hi" $HOME \\n end', "B": ""})
    dockerfile, _ = templates.render_dockerfile(template, BASE_ID, installer=False)
    assert 'ENV A="say \\"hi\\" \\$HOME \\\\n end" B=""' in dockerfile


def test_package_pins_are_quoted_for_the_shell() -> None:
    dockerfile, _ = templates.render_dockerfile(
        Template(base_image=BASE, apt_packages=("jq=1:1.6~x",)), BASE_ID, installer=False
    )
    assert "--no-install-recommends 'jq=1:1.6~x'" in json.loads(instructions(dockerfile)[3][4:])[2]


def context_members(fake: FakeBuildAPI) -> dict[str, dict[str, tuple[tarfile.TarInfo, bytes]]]:
    """The inner tars of the last build context: tar name -> member name -> (info, content)."""
    inner: dict[str, dict[str, tuple[tarfile.TarInfo, bytes]]] = {}
    with tarfile.open(fileobj=io.BytesIO(fake.contexts[-1])) as outer:
        for member in outer.getmembers():
            data = outer.extractfile(member)
            assert data is not None
            if member.name.endswith(".tar"):
                with tarfile.open(fileobj=io.BytesIO(data.read())) as tar:
                    inner[member.name] = {m.name: (m, read_member(tar, m)) for m in tar.getmembers()}
    return inner


def read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    data = tar.extractfile(member)
    return data.read() if data is not None else b""


def test_files_tar_has_only_file_entries_owned_by_root(fake: FakeBuildAPI) -> None:
    template = Template(base_image=BASE, files={"/etc/app/deep/a.txt": "alpha", "/opt/b": b"\x00"})
    template.build(api=as_api(fake))
    files = context_members(fake)["files.tar"]
    members = [info for info, _ in files.values()]
    # No directory entries: existing directories in the image keep their owner and mode.
    assert [(m.name, m.isfile()) for m in members] == [("etc/app/deep/a.txt", True), ("opt/b", True)]
    assert {(m.mode, m.uid, m.gid, m.mtime) for m in members} == {(0o644, 0, 0, 315532800)}
    assert files["etc/app/deep/a.txt"][1] == b"alpha"


def test_wheels_tar_stages_the_wheels_and_the_pip_to_run_them(fake: FakeBuildAPI, wheels: Path) -> None:
    Template(base_image=BASE, wheels=str(wheels)).build(api=as_api(fake))
    staged = context_members(fake)["wheels.tar"]
    assert staged["tmp/agentnest-wheels/wheels/beta-2.0-py3-none-any.whl"][1] == b"beta wheel"
    names = sorted(staged)
    assert names == [
        "tmp/agentnest-wheels/installer/pip.whl",
        "tmp/agentnest-wheels/wheels/alpha-1.0-py3-none-any.whl",
        "tmp/agentnest-wheels/wheels/beta-2.0-py3-none-any.whl",
    ]


# -- the build loop, against a fake engine ---------------------------------------------


class FakeBuildAPI:
    """The slice of docker-py's ``APIClient`` a template build uses.

    ``build`` plays the classic builder: a ``Step i/n`` line per instruction
    (plus one per label), a layer ID after each, and ``fail_at`` makes that
    step fail after printing ``failure_output``.
    """

    def __init__(self) -> None:
        self.images: dict[str, dict[str, Any]] = {BASE: {"Id": BASE_ID, "RepoTags": [BASE]}}
        self.builds: list[dict[str, Any]] = []
        self.contexts: list[bytes] = []
        self.removed: list[str] = []
        self.pulls: list[tuple[str, str | None]] = []
        self.tags: list[tuple[str, str, str | None, bool]] = []
        self.fail_at: int | None = None
        self.failure_output = "boom: exit 3"
        self.output = "some build output"

    def inspect_image(self, ref: str) -> dict[str, Any]:
        for key, info in self.images.items():
            if ref in (key, info["Id"]) or info["Id"].removeprefix("sha256:").startswith(ref):
                return info
        raise docker.errors.ImageNotFound(f"No such image: {ref}")

    def pull(self, repo: str, tag: str | None = None) -> None:
        self.pulls.append((repo, tag))
        raise docker.errors.APIError("no registry here")

    def tag(self, image: str, repository: str, tag: str | None = None, force: bool = False) -> bool:
        self.tags.append((image, repository, tag, force))
        self.images[f"{repository}:{tag}"] = self.inspect_image(image)
        return True

    def remove_image(self, ref: str, noprune: bool = False) -> None:
        self.removed.append(ref)
        for key, info in list(self.images.items()):
            if ref in (key, info["Id"]) or info["Id"].removeprefix("sha256:").startswith(ref):
                del self.images[key]

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.builds.append(kwargs)
        self.contexts.append(kwargs["fileobj"].read())
        return self._stream(kwargs)

    def _stream(self, kwargs: Any) -> Iterator[dict[str, Any]]:
        with tarfile.open(fileobj=io.BytesIO(self.contexts[-1])) as outer:
            member = outer.extractfile("Dockerfile")
            assert member is not None
            lines = instructions(member.read().decode())
        lines += [f"LABEL {k}={v}" for k, v in kwargs["labels"].items()]
        layer = ""
        for i, line in enumerate(lines, 1):
            # Split across chunks, as the engine does.
            yield {"stream": f"Step {i}/{len(lines)} : "}
            yield {"stream": f"{line}\n"}
            if i == self.fail_at:
                yield {"stream": f" ---> Running in {'e' * 12}\n"}
                yield {"stream": f"\x1b[91m{self.failure_output}\n\x1b[0m"}
                yield {"error": "The command returned a non-zero code: 3", "errorDetail": {"code": 3}}
                return
            if line.startswith("RUN"):
                yield {"stream": f" ---> Running in {'e' * 12}\n{self.output}\r\n"}
                yield {"stream": f"Removing intermediate container {'e' * 12}\n"}
            layer = f"{i:012x}"
            self.images[f"layer-{i}"] = {"Id": f"sha256:{layer}{'0' * 52}", "RepoTags": []}
            yield {"stream": f" ---> {layer}\n"}
        new_id = f"sha256:{len(self.builds):064x}"
        replaced = self.images.get(kwargs["tag"])
        if replaced is not None:  # the tag moves; the old image stays, untagged
            self.images[f"untagged-{replaced['Id']}"] = {**replaced, "RepoTags": []}
        self.images[kwargs["tag"]] = {
            "Id": new_id,
            "RepoTags": [kwargs["tag"]],
            "Config": {"Labels": dict(kwargs["labels"])},
        }
        yield {"aux": {"ID": new_id}}
        yield {"stream": f"Successfully built {layer}\nSuccessfully tagged {kwargs['tag']}\n"}


def as_api(fake: FakeBuildAPI) -> Any:
    """The fake where a docker-py ``APIClient`` is expected."""
    return fake


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBuildAPI:
    monkeypatch.setattr("agentnest.runtime.docker.images.apt_mirror", lambda: "http://mirror.invalid/debian")
    return FakeBuildAPI()


class Recorder:
    def __init__(self) -> None:
        self.events: list[BuildEvent] = []

    def __call__(self, event: BuildEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


def test_build_streams_steps_and_labels_the_image(fake: FakeBuildAPI) -> None:
    template = spec()
    seen = Recorder()
    tag = template.build(api=as_api(fake), progress=seen)
    assert tag == template.tag_for(BASE_ID)
    (call,) = fake.builds
    assert call["tag"] == tag and call["custom_context"] is True and call["decode"] is True
    assert (call["rm"], call["forcerm"], call["pull"], call["nocache"]) == (True, True, False, False)
    assert call["labels"] == {LABEL: template.digest(BASE_ID), LABEL_BASE: BASE_ID}
    assert call["buildargs"] == {templates.MIRROR_ARG: "http://mirror.invalid/debian"}
    assert call["use_config_proxy"] is False
    assert seen.kinds()[0] == "resolved" and seen.kinds()[-1] == "built"
    steps = [e for e in seen.events if e.kind == "step"]
    assert [(e.step, e.total) for e in steps] == [(i, 12) for i in range(1, 13)]
    assert steps[3].message == "install 2 Debian packages: curl jq"
    assert steps[-1].message == "label agentnest.template.base"
    outputs = [e.message for e in seen.events if e.kind == "output"]
    # Command output only: the engine's bookkeeping lines are not build output.
    assert outputs == ["some build output"] * 3


def test_a_build_holds_a_lock_file_and_leaves_none_behind(fake: FakeBuildAPI) -> None:
    import tempfile

    template = spec()
    lock = Path(tempfile.gettempdir()) / f"agentnest-template-{template.digest(BASE_ID)[:16]}.lock"
    held: list[tuple[str, bool]] = []
    template.build(api=as_api(fake), progress=lambda event: held.append((event.kind, lock.exists())))
    # Taken once the tag is known, held through every step.
    assert held[0] == ("resolved", False)
    assert len(held) > 3 and all(exists for _, exists in held[1:])
    assert not lock.exists()


def test_without_packages_no_mirror_is_passed(fake: FakeBuildAPI) -> None:
    Template(base_image=BASE, commands=("true",)).build(api=as_api(fake))
    assert fake.builds[0]["buildargs"] is None


def test_the_same_spec_is_not_built_twice(fake: FakeBuildAPI) -> None:
    template = spec()
    tag = template.build(api=as_api(fake))
    seen = Recorder()
    assert spec().build(api=as_api(fake), progress=seen) == tag
    assert len(fake.builds) == 1
    assert seen.kinds() == ["resolved", "cached"]


def test_force_rebuilds_without_cache_and_drops_the_replaced_image(fake: FakeBuildAPI) -> None:
    template = spec()
    tag = template.build(api=as_api(fake))
    old_id = fake.images[tag]["Id"]
    template.build(api=as_api(fake), force=True)
    assert [b["nocache"] for b in fake.builds] == [False, True]
    assert fake.images[tag]["Id"] != old_id
    # The image that lost the tag is removed rather than left dangling.
    assert fake.removed == [old_id]
    assert old_id not in {info["Id"] for info in fake.images.values()}


def test_an_image_with_the_tag_but_another_label_is_rebuilt(fake: FakeBuildAPI) -> None:
    template = spec()
    fake.images[template.tag_for(BASE_ID)] = {"Id": "sha256:" + "f" * 64, "Config": {"Labels": {}}}
    seen = Recorder()
    template.build(api=as_api(fake), progress=seen)
    assert len(fake.builds) == 1
    assert "not built from this spec" in seen.events[1].message


def test_a_failed_step_says_which_and_shows_its_output(fake: FakeBuildAPI) -> None:
    fake.fail_at = 7
    fake.failure_output = "jq: error: something broke"
    with pytest.raises(BackendError) as caught:
        spec().build(api=as_api(fake))
    message = str(caught.value)
    assert "failed at step 7/12 (run: echo one > /opt/one)" in message
    assert "non-zero code: 3" in message
    # The failing step's own output, not that of the steps before it.
    assert message.endswith(": The command returned a non-zero code: 3\n  jq: error: something broke")
    assert "\x1b" not in message  # the builder's colours are stripped
    # The layer the failed build committed last is removed (its parents go with it).
    assert fake.removed == [f"{6:012x}"]
    assert spec().tag_for(BASE_ID) not in fake.images


def test_a_failure_before_any_layer_removes_nothing(fake: FakeBuildAPI) -> None:
    fake.fail_at = 1
    with pytest.raises(BackendError, match="step 1/12"):
        spec().build(api=as_api(fake))
    assert fake.removed == []


def test_a_missing_base_image_is_pulled_then_explained(fake: FakeBuildAPI) -> None:
    with pytest.raises(ImageNotFoundError, match="could not be pulled"):
        spec(base_image="nowhere/to-be:found").build(api=as_api(fake))
    assert fake.pulls == [("nowhere/to-be", "found")]
    assert fake.builds == []


def test_a_missing_default_image_says_how_to_build_it(fake: FakeBuildAPI) -> None:
    with pytest.raises(ImageNotFoundError, match="agentnest image base"):
        Template().build(api=as_api(fake))
    assert fake.pulls == []


# -- progress display and the command line ----------------------------------------------


class Terminal(io.StringIO):
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def isatty(self) -> bool:
        return True


def feed(display: image_cmd.BuildDisplay, *events: BuildEvent) -> None:
    for event in events:
        display(event)
    display.close()


EVENTS = (
    BuildEvent("resolved", "agentnest/template:abc"),
    BuildEvent("step", "base image abc", 1, 2),
    BuildEvent("step", "run: make", 2, 2),
    BuildEvent("output", "compiling", 2, 2),
    BuildEvent("built", "agentnest/template:abc"),
)


def test_display_prints_one_line_per_step_when_not_a_terminal() -> None:
    out = io.StringIO()
    display = image_cmd.BuildDisplay(out)
    feed(display, *EVENTS)
    assert out.getvalue() == "  [1/2] base image abc\n  [2/2] run: make\n"
    assert (display.outcome, display.steps) == ("built", 2)


def test_display_verbose_prints_the_output_too() -> None:
    out = io.StringIO()
    feed(image_cmd.BuildDisplay(out, verbose=True), *EVENTS)
    assert "      compiling\n" in out.getvalue()


def test_display_on_a_terminal_redraws_a_status_line_and_keeps_finished_steps() -> None:
    out = Terminal()
    display = image_cmd.BuildDisplay(out)
    feed(display, *EVENTS)
    text = out.getvalue()
    assert "\r\x1b[K" in text
    assert "[2/2] run: make · compiling" in text  # the latest output beside the step
    finished = [line.split("\x1b[K")[-1] for line in text.split("\n") if line.strip("\r\x1b[K")]
    assert finished == ["  ✓ [1/2] base image abc", "  ✓ [2/2] run: make"]
    assert text.endswith("\r\x1b[K")  # the status line is cleared at the end


def test_display_falls_back_to_ascii() -> None:
    out = io.StringIO()  # no encoding: ASCII only
    display = image_cmd.BuildDisplay(out, tty=True)
    feed(display, *EVENTS)
    assert "  OK [1/2] base image abc\n" in out.getvalue()
    assert all(ord(c) < 128 for c in out.getvalue())


@pytest.fixture
def cli_engine(monkeypatch: pytest.MonkeyPatch, fake: FakeBuildAPI) -> FakeBuildAPI:
    monkeypatch.setattr(image_cmd, "_docker_api", lambda: fake)
    return fake


def write_json_spec(tmp_path: Path) -> Path:
    path = tmp_path / "template.json"
    path.write_text(json.dumps({"base_image": BASE, "files": {"/etc/x": "y"}, "commands": ["true"]}))
    return path


def test_cli_build_then_cached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_engine: FakeBuildAPI
) -> None:
    path = write_json_spec(tmp_path)
    tag = Template.from_file(path).tag_for(BASE_ID)
    assert main(["image", "build", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{tag}: built in ") and out.endswith(" s (8 steps)\n")
    assert "  [5/8] sandbox user 65532\n" in err
    assert main(["image", "build", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{tag}: cached (built before from the same spec; --force rebuilds)\n"
    assert err == ""
    assert main(["image", "build", "-q", "--force", str(path)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"{tag}\n", "")
    assert [b["nocache"] for b in cli_engine.builds] == [False, True]


def test_cli_build_with_a_bad_spec_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_engine: FakeBuildAPI
) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"apt_packages": ["Not A Package"]}')
    assert main(["image", "build", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: apt package 'Not' (in 'Not A Package')")
    assert cli_engine.builds == []


def test_cli_build_failure_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cli_engine: FakeBuildAPI
) -> None:
    cli_engine.fail_at = 4
    assert main(["image", "build", str(write_json_spec(tmp_path))]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "error: building agentnest/template:" in err and "failed at step 4/8 (run: true)" in err
    assert "Traceback" not in err


def test_cli_build_without_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    monkeypatch.setattr(registry, "_shared", {})
    assert main(["image", "build", str(write_json_spec(tmp_path))]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and "not reachable" in err
    assert err.count("\n") == 1


def test_cli_build_help_shows_a_spec_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["image", "build", "--help"]) == 0
    out = capsys.readouterr().out
    assert "agentnest image build template.json" in out
    assert '"apt_packages"' in out and '"source"' in out


def test_cli_list_marks_templates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class ListingAPI:
        def images(self, name: str | None = None, filters: Any = None) -> list[dict[str, Any]]:
            if filters == {"label": LABEL}:
                return [
                    {
                        "Id": "sha256:" + "1" * 64,
                        "RepoTags": ["agentnest/template:111111111111"],
                        "Created": 2,
                        "Size": 2048,
                        "Labels": {LABEL: "1" * 64, "agentnest.recipe": "bookworm-x"},
                    }
                ]
            return []

    monkeypatch.setattr(image_cmd, "_docker_api", ListingAPI)
    assert main(["image", "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["IMAGE", "KIND", "ID", "CREATED", "SIZE", "DEFAULT"]
    assert row.split()[:3] == ["agentnest/template:111111111111", "template", "111111111111"]


# -- 0.3.0's Template: positions, names, builder methods, dockerfile(), build(tag, client=) --


#: 0.3.0's own unit test (tests/test_addons.py), on a local base: its builder chain.
def chain_0_3_0() -> Template:
    return (
        Template(BASE)
        .apt_install("git")
        .pip_install("requests==2.32.3")
        .with_environment(MODE="test value")
        .run("python -V")
    )


def test_0_3_0_positions_mean_what_they_meant() -> None:
    """Template(base_image, packages, system_packages, environment, commands)."""
    positional = Template(BASE, ("requests==2.32.3",), ("git",), {"MODE": "test value"}, ("python -V",))
    assert positional.base_image == BASE
    assert positional.pip_packages == ("requests==2.32.3",)
    assert positional.apt_packages == ("git",)
    assert dict(positional.environment) == {"MODE": "test value"}
    assert positional.commands == ("python -V",)
    assert positional == chain_0_3_0()
    assert positional.tag_for(BASE_ID) == chain_0_3_0().tag_for(BASE_ID)


def test_0_3_0_keywords_are_deprecated_aliases() -> None:
    with pytest.deprecated_call() as caught:
        old = Template(base_image=BASE, packages=("requests==2.32.3",), system_packages=("git",))
    assert [str(w.message).split("; ")[1] for w in caught] == [
        "it still works, but use pip_packages=",
        "it still works, but use apt_packages=",
    ]
    assert old == Template(base_image=BASE, pip_packages=("requests==2.32.3",), apt_packages=("git",))
    with pytest.deprecated_call(match="use apt_packages="):
        Template(BASE, system_packages=["git"])


def test_0_3_0_field_names_read_the_new_fields_with_a_warning() -> None:
    template = chain_0_3_0()
    with pytest.deprecated_call(match="use Template.pip_packages"):
        assert template.packages == ("requests==2.32.3",)
    with pytest.deprecated_call(match="use Template.apt_packages"):
        assert template.system_packages == ("git",)


def test_deprecation_warnings_point_at_the_caller() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        template = Template(BASE, packages=("rich",))
        assert template.packages == ("rich",)
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    assert {w.filename for w in caught} == {__file__}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pip_packages": ("rich",), "packages": ("click",)},
        {"apt_packages": ("jq",), "system_packages": ("git",)},
    ],
)
def test_an_old_and_a_new_name_together_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        Template(BASE, **kwargs)


def test_positional_and_keyword_for_one_field_is_refused_as_python_does() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        Template(BASE, ("rich",), packages=("click",))


def test_builder_methods_return_new_templates_and_leave_the_old_one() -> None:
    plain = Template(BASE)
    with_git = plain.apt_install("git", "curl jq")
    assert plain.apt_packages == ()
    assert with_git.apt_packages == ("curl", "git", "jq")
    assert with_git.apt_install().apt_packages == with_git.apt_packages
    pip = with_git.pip_install("rich", "click==8.1.7")
    assert (with_git.pip_packages, pip.pip_packages) == ((), ("click==8.1.7", "rich"))
    ran = pip.run("echo one > /opt/one").run("echo two > /opt/two", "true")
    assert ran.commands == ("echo one > /opt/one", "echo two > /opt/two", "true")
    env = ran.with_environment(A="1", B="2").with_environment(B="3")
    assert dict(env.environment) == {"A": "1", "B": "3"}
    assert dict(ran.environment) == {}
    # Everything else is carried over, and the result is frozen like any template.
    assert (env.base_image, env.apt_packages, env.pip_packages) == (
        BASE,
        ("curl", "git", "jq"),
        pip.pip_packages,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.commands = ()  # type: ignore[misc]


def test_builder_methods_keep_wheels_and_files(wheels: Path) -> None:
    template = spec(wheels=str(wheels)).run("true").with_environment(X="1").apt_install("git")
    assert template.wheels == str(wheels)
    assert dict(template.files) == dict(spec().files)


def test_builder_methods_validate_like_the_constructor() -> None:
    with refused("Debian package name"):
        Template(BASE).apt_install("jq;id")
    with refused("not a requirement"):
        Template(BASE).pip_install("--index-url=http://evil/simple")
    with refused("Secret"):
        Template(BASE).with_environment(TOKEN=Secret("hunter2"))  # type: ignore[arg-type]
    with refused("set by the sandbox"):
        Template(BASE).with_environment(PATH="/opt/venv/bin:/usr/bin")
    with refused("command"):
        Template(BASE).run("")


def test_the_order_of_run_steps_is_in_the_tag_and_the_rest_is_not() -> None:
    one = Template(BASE).run("a", "b").apt_install("jq", "git").with_environment(A="1", B="2")
    two = Template(BASE).with_environment(B="2", A="1").apt_install("git").apt_install("jq").run("a").run("b")
    assert one.tag_for(BASE_ID) == two.tag_for(BASE_ID)
    assert Template(BASE).run("b", "a").tag_for(BASE_ID) != Template(BASE).run("a", "b").tag_for(BASE_ID)


@pytest.mark.parametrize(
    "requirement",
    [
        "requests",
        "requests==2.32.3",
        "requests[socks,use_chardet_on_py3]>=2.31,<3",
        "zope.interface~=6.0",
        "Django!=4.0.*",
        "torch==2.3.0+cpu",
        "my_pkg===1.0",
    ],
)
def test_pip_requirements_accepted(requirement: str) -> None:
    assert Template(BASE, pip_packages=(requirement,)).pip_packages == (requirement,)


@pytest.mark.parametrize(
    "requirement",
    [
        "-r",
        "--index-url=http://x",
        "git+https://github.com/psf/requests",
        "https://example.com/x.whl",
        "./dist/x.whl",
        "requests>=",
        "requests;python_version<'3.12'",
        "requests$(id)",
        "requests[",
    ],
)
def test_pip_options_urls_and_paths_are_refused(requirement: str) -> None:
    with refused("not a requirement"):
        Template(BASE, pip_packages=(requirement,))


def test_pip_packages_are_sorted_and_deduplicated_and_in_the_tag_only_when_used() -> None:
    template = Template(BASE, pip_packages=("rich", "click", "rich"))
    assert template.pip_packages == ("click", "rich")
    assert template.canonical(BASE_ID)["pip_packages"] == ["click", "rich"]
    # Without pip packages the canonical form is the one from before they existed
    # (test_tag_is_pinned_for_a_fixed_spec), so no existing tag changes.
    assert "pip_packages" not in Template(BASE).canonical(BASE_ID)
    assert template.tag_for(BASE_ID) != Template(BASE, pip_packages=("click",)).tag_for(BASE_ID)
    assert template.tag_for(BASE_ID) != Template(BASE).tag_for(BASE_ID)
    assert template.tag_for(BASE_ID) == Template(BASE).pip_install("rich", "click").tag_for(BASE_ID)


def write_wheels(directory: Path, *names: str) -> Path:
    directory.mkdir(exist_ok=True)
    for name in names:
        (directory / name).write_bytes(name.encode())
    return directory


def test_pip_packages_must_have_a_wheel_when_wheels_are_given(tmp_path: Path) -> None:
    wheels = write_wheels(tmp_path / "w", "Rich-13.0-py3-none-any.whl", "zope.interface-6.0-py3-none-any.whl")
    # Names compare as pip compares them (PEP 503): case, '-', '_' and '.' alike.
    ok = Template(BASE, pip_packages=("rich==13.0", "Zope-Interface"), wheels=str(wheels))
    assert ok.pip_packages == ("Zope-Interface", "rich==13.0")
    with refused("no wheel in") as caught:
        Template(BASE, wheels=str(wheels)).pip_install("rich", "requests==2.32.3", "click")
    message = str(caught.value)
    assert "requests==2.32.3 click" in message or "click requests==2.32.3" in message
    assert f"pip download --only-binary=:all: -d {wheels}" in message


def test_pip_packages_without_wheels_build_nothing_and_say_how_to_get_them(fake: FakeBuildAPI) -> None:
    template = chain_0_3_0()
    with pytest.raises(TemplateBuildError) as caught:
        template.build(api=as_api(fake))
    message = str(caught.value)
    assert "offline" in message
    assert "pip download --only-binary=:all: -d wheels requests==2.32.3" in message
    assert "wheels='wheels'" in message
    # As 0.3.0 raised for a failed build, so its handlers still catch it.
    assert isinstance(caught.value, RuntimeNotAvailableError)
    assert fake.builds == [] and fake.pulls == []


def test_pip_packages_are_installed_from_the_wheels_only(fake: FakeBuildAPI, tmp_path: Path) -> None:
    wheels = write_wheels(tmp_path / "w", "rich-13.0-py3-none-any.whl", "pygments-2.0-py3-none-any.whl")
    template = Template(BASE, wheels=str(wheels)).pip_install("rich==13.0")
    dockerfile, steps = templates.render_dockerfile(template, BASE_ID, installer=True)
    pip = next(json.loads(line[4:])[2] for line in instructions(dockerfile) if "pip install" in line)
    # The requirement, resolved from the staged wheels; not every wheel in the directory.
    assert "pip install --no-index --find-links /tmp/agentnest-wheels/wheels rich==13.0\n" in pip
    assert "*.whl" not in pip
    assert "pip install (offline): rich==13.0" in steps
    tag = template.build(api=as_api(fake))
    assert tag == template.tag_for(BASE_ID)
    staged = context_members(fake)["wheels.tar"]
    assert "tmp/agentnest-wheels/wheels/pygments-2.0-py3-none-any.whl" in staged


def test_dockerfile_describes_the_spec_without_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_engine() -> None:
        raise AssertionError("dockerfile() asked the engine")

    monkeypatch.setattr(templates, "_engine_factory", no_engine)
    text = chain_0_3_0().dockerfile()
    lines = instructions(text)
    assert lines[0] == f"FROM {BASE}"  # the name as given; build() pins the ID
    assert "apt-get install -y --no-install-recommends git" in text
    assert "requests==2.32.3" in text
    assert 'ENV MODE="test value"' in lines
    # The build commands run as root, before the sandbox user is set.
    assert lines.index('RUN ["/bin/sh", "-c", "python -V"]') < lines.index("USER 65532:65532")
    assert lines[-2:] == ["USER 65532:65532", "WORKDIR /workspace"]
    # The same text the build sends, but for the base's name.
    built, _ = templates.render_dockerfile(chain_0_3_0(), BASE_ID, installer=False)
    assert built.replace(f"FROM {BASE_ID}", f"FROM {BASE}") == text


def test_build_with_a_tag_tags_the_content_image_and_returns_the_tag(fake: FakeBuildAPI) -> None:
    template = spec()
    assert template.build("my/agent:1", api=as_api(fake)) == "my/agent:1"
    content = template.tag_for(BASE_ID)
    assert fake.tags == [(content, "my/agent", "1", True)]
    assert fake.images["my/agent:1"]["Id"] == fake.images[content]["Id"]
    # The same spec again: nothing is built, the name is tagged again; a bare name is :latest.
    assert template.build(tag="my/agent", api=as_api(fake)) == "my/agent"
    assert len(fake.builds) == 1
    assert fake.tags[-1] == (content, "my/agent", "latest", True)
    assert template.build(api=as_api(fake)) == content


def test_build_takes_a_docker_client_as_0_3_0_did(fake: FakeBuildAPI) -> None:
    class DockerClient:  # the slice of docker.DockerClient used: its APIClient
        api = fake

    client: Any = DockerClient()
    assert spec().build(client=client) == spec().tag_for(BASE_ID)
    assert len(fake.builds) == 1


def test_build_refuses_two_engines_or_things_that_are_not_one(fake: FakeBuildAPI) -> None:
    client: Any = type("DockerClient", (), {"api": fake})()
    with refused("not both"):
        spec().build(client=client, api=as_api(fake))
    not_a_client: Any = object()
    with refused("DockerClient"):
        spec().build(client=not_a_client)
    a_url: Any = "unix:///var/run/docker.sock"
    with refused("APIClient"):
        spec().build(api=a_url)
    assert fake.builds == []


@pytest.mark.parametrize(
    ("tag", "why"),
    [
        ("My/Agent:1", "not an image tag"),
        ("my agent", "not an image tag"),
        ("my/agent@sha256:" + "a" * 64, "digest"),
        ("my/agent:", "not an image tag"),
        ("agentnest/template:abc", "content-addressed"),
    ],
)
def test_build_refuses_bad_tags_before_building(fake: FakeBuildAPI, tag: str, why: str) -> None:
    with refused(why):
        spec().build(tag, api=as_api(fake))
    assert fake.builds == [] and fake.tags == []


def test_an_api_client_in_the_tag_position_is_explained(fake: FakeBuildAPI) -> None:
    """Ours took the APIClient first before 0.3.0's ``tag`` got that place back."""
    with refused(r"build\(api=\.\.\.\)"):
        spec().build(as_api(fake))
    assert fake.builds == []


def test_a_failed_build_is_the_0_3_0_error_type_too(fake: FakeBuildAPI) -> None:
    fake.fail_at = 7
    with pytest.raises(TemplateBuildError, match="failed at step 7/12") as caught:
        spec().build(api=as_api(fake))
    assert isinstance(caught.value, RuntimeNotAvailableError)  # 0.3.0's type
    assert isinstance(caught.value, BackendError)
    assert isinstance(caught.value.__cause__, BackendError)


def test_a_missing_base_is_the_0_3_0_error_type_too(fake: FakeBuildAPI) -> None:
    with pytest.raises(TemplateBaseNotFoundError, match="could not be pulled") as caught:
        Template("python:3.12-slim").build(api=as_api(fake))
    assert isinstance(caught.value, ImageNotFoundError)
    assert isinstance(caught.value, RuntimeNotAvailableError)


def test_dataclass_tools_see_the_new_fields() -> None:
    names = [f.name for f in dataclasses.fields(Template)]
    assert names == [
        "base_image",
        "pip_packages",
        "apt_packages",
        "environment",
        "commands",
        "wheels",
        "files",
    ]
    template = chain_0_3_0()
    assert dataclasses.replace(template, commands=()) == Template(BASE).apt_install("git").pip_install(
        "requests==2.32.3"
    ).with_environment(MODE="test value")


def test_spec_files_take_pip_packages(tmp_path: Path) -> None:
    wheels = write_wheels(tmp_path / "wheels", "rich-13.0-py3-none-any.whl")
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"base_image": BASE, "pip_packages": ["rich"], "wheels": "wheels"}))
    assert Template.from_file(path) == Template(BASE, ("rich",), wheels=str(wheels))
    path.write_text(json.dumps({"pip_packages": "rich"}))
    with refused("must be a list"):
        Template.from_file(path)
