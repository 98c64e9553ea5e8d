"""Templates against the real engine: build, run, cache hits, failures, forced rebuilds, the CLI.

The main template installs a small Debian package (jq) from the mirror, a
wheel written here by hand, a file, an environment value and a build
command; it is built once per module and removed afterwards, with every
other image these tests create.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from agentnest import Sandbox, Template
from agentnest.cli import main
from agentnest.errors import BackendError
from agentnest.runtime.docker.images import base_image, image_exists
from agentnest.templates import LABEL, LABEL_BASE, BuildEvent

from .helpers import SANDBOX_UID

pytestmark = pytest.mark.docker

#: Written verbatim into the image: quotes, a dollar sign and a backslash must survive.
TRICKY = 'say "hi" to $HOME \\ and `id`'
BUILT_AT = "/opt/demo/built-by-command.txt"


def write_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel with a module and a console script (PEP 427, by hand)."""
    files = {
        "nestdemo/__init__.py": b"VALUE = 42\n\n\ndef main():\n    print('nestdemo says', VALUE)\n",
        "nestdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: nestdemo\nVersion: 1.0\n",
        "nestdemo-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: agentnest-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        "nestdemo-1.0.dist-info/entry_points.txt": b"[console_scripts]\nnestdemo = nestdemo:main\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("nestdemo-1.0.dist-info/RECORD,,")
    path = directory / "nestdemo-1.0-py3-none-any.whl"
    # Fixed timestamps: the same wheel, byte for byte, every time it is written.
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
        record_info = zipfile.ZipInfo("nestdemo-1.0.dist-info/RECORD", (1980, 1, 1, 0, 0, 0))
        wheel.writestr(record_info, "\n".join(record) + "\n")
    return path


class Recorder:
    def __init__(self) -> None:
        self.events: list[BuildEvent] = []

    def __call__(self, event: BuildEvent) -> None:
        self.events.append(event)

    def kinds(self, kind: str) -> list[BuildEvent]:
        return [e for e in self.events if e.kind == kind]


class CountingAPI:
    """The real ``APIClient``, counting ``build`` calls."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.builds = 0

    def build(self, **kwargs: Any) -> Any:
        self.builds += 1
        return self._api.build(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    import docker

    client = docker.APIClient(version="auto", timeout=120)
    if not image_exists(client, base_image()):
        pytest.skip("the default image is not built (`agentnest image base`)")
    yield client
    client.close()


@pytest.fixture(scope="module")
def created(api: Any) -> Iterator[list[str]]:
    """Tags and IDs of images built here; all removed when the module is done."""
    made: list[str] = []
    yield made
    for ref in reversed(made):
        try:
            api.remove_image(ref, force=True)
        except docker.errors.NotFound:
            pass
    for ref in made:
        with pytest.raises(docker.errors.ImageNotFound):
            api.inspect_image(ref)


def template_of(wheels: Path) -> Template:
    return Template(
        apt_packages=("jq",),
        wheels=str(wheels),
        files={"/opt/demo/hello.txt": "hello from the template\n", "/etc/demo/blob.bin": bytes(range(256))},
        environment={"DEMO_MODE": "strict", "DEMO_TRICKY": TRICKY},
        commands=(f"jq -n '{{built: (1 + 1)}}' > {BUILT_AT}",),
    )


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    write_wheel(directory)
    return directory


@pytest.fixture(scope="module")
def built(api: Any, created: list[str], wheels: Path) -> tuple[str, Recorder, float]:
    """The main template, built once: (tag, its progress events, seconds)."""
    template = template_of(wheels)
    seen = Recorder()
    started = time.monotonic()
    # force: a real build even if an earlier, interrupted run left the image behind.
    tag = template.build(api=api, progress=seen, force=True)
    elapsed = time.monotonic() - started
    created.append(tag)
    print(f"\nfirst build of {tag}: {elapsed:.1f} s")
    return tag, seen, elapsed


def test_the_mirror_has_the_package(api: Any) -> None:
    """The test's premise: the machine's Debian mirror serves jq."""
    import shutil
    import subprocess

    if shutil.which("apt-cache") is None:
        pytest.skip("no apt-cache on this host")
    out = subprocess.run(["apt-cache", "show", "jq"], capture_output=True, text=True).stdout
    assert "Package: jq" in out


def test_this_host_has_a_pip_wheel_to_lend() -> None:
    """The default image has no pip: the host's pip wheel installs the wheels."""
    from agentnest.templates import installer_wheel

    found = installer_wheel()
    assert found is not None and found.name.startswith("pip-") and found.name.endswith(".whl")


def test_build_streams_steps_and_labels_the_image(api: Any, built: tuple[str, Recorder, float]) -> None:
    tag, seen, _ = built
    assert tag.startswith("agentnest/template:")
    assert [e.kind for e in seen.events][:1] == ["resolved"]
    assert seen.events[-1].kind == "built"
    steps = seen.kinds("step")
    assert [e.step for e in steps] == list(range(1, len(steps) + 1))
    assert {e.total for e in steps} == {len(steps)}
    assert any(e.message == "install 1 Debian package: jq" for e in steps)
    # apt's own output streamed while it ran.
    assert any("jq" in e.message for e in seen.kinds("output"))
    info = api.inspect_image(tag)
    labels = info["Config"]["Labels"]
    base_id = api.inspect_image(base_image())["Id"]
    assert labels[LABEL_BASE] == base_id
    assert tag.endswith(":" + labels[LABEL][:12])
    assert info["Config"]["User"] == "65532:65532"
    assert info["Config"]["WorkingDir"] == "/workspace"


@pytest.mark.parametrize("backend", ["docker", pytest.param("gvisor", marks=pytest.mark.gvisor)])
def test_a_sandbox_from_the_template_has_everything(built: tuple[str, Recorder, float], backend: str) -> None:
    tag, _, _ = built
    with Sandbox(image=tag, backend=backend, timeout=120) as sandbox:
        assert sandbox.exec_shell("id -u").check().stdout.strip() == str(SANDBOX_UID)
        assert sandbox.exec_shell("pwd").check().stdout.strip() == "/workspace"
        # The Debian package.
        assert sandbox.exec_shell("jq -n '[1, 2] | add'").check().stdout.strip() == "3"
        # The files, byte for byte, owned by root and not writable by the sandbox.
        assert sandbox.exec_shell("cat /opt/demo/hello.txt").check().stdout == "hello from the template\n"
        blob = sandbox.exec_python(
            "import hashlib; print(hashlib.sha256(open('/etc/demo/blob.bin', 'rb').read()).hexdigest())"
        )
        assert blob.check().stdout.strip() == hashlib.sha256(bytes(range(256))).hexdigest()
        # (coreutils' stat and ls fail under gVisor: ask Python.)
        modes = sandbox.exec_json(
            "import os, json; print(json.dumps({p: [os.stat(p).st_uid, oct(os.stat(p).st_mode & 0o7777)]"
            " for p in ('/opt/demo/hello.txt', '/opt/demo', '/tmp')}))"
        )
        assert modes["/opt/demo/hello.txt"] == [0, "0o644"]
        assert modes["/opt/demo"] == [0, "0o755"]
        # /tmp kept its sticky, world-writable mode (the files tar has no directory entries).
        assert modes["/tmp"][1] == "0o1777"
        # The environment, verbatim.
        env = sandbox.exec_json("import os, json; print(json.dumps(dict(os.environ)))")
        assert env["DEMO_MODE"] == "strict"
        assert env["DEMO_TRICKY"] == TRICKY
        # The build command ran, with jq, as root.
        assert json.loads(sandbox.exec_shell(f"cat {BUILT_AT}").check().stdout) == {"built": 2}
        # The wheel: importable, and its console script on PATH.
        assert sandbox.exec_python("import nestdemo; print(nestdemo.VALUE)").check().stdout.strip() == "42"
        assert sandbox.exec_shell("nestdemo").check().stdout.strip() == "nestdemo says 42"
        # Nothing of the build is left behind: no apt lists, no staged wheels.
        left = sandbox.exec_json(
            "import os, json; print(json.dumps([sorted(os.listdir('/var/lib/apt/lists')),"
            " os.path.exists('/tmp/agentnest-wheels')]))"
        )
        assert left == [[], False]


def test_the_same_spec_again_is_a_cache_hit(
    api: Any, built: tuple[str, Recorder, float], wheels: Path
) -> None:
    tag, _, first = built
    image_id = api.inspect_image(tag)["Id"]
    before = {i["Id"] for i in api.images(all=True)}
    counting = CountingAPI(api)
    seen = Recorder()
    started = time.monotonic()
    # An equal spec, written in another order (and with lists), is the same spec.
    packages: Any = ["jq", "jq"]
    commands: Any = [f"jq -n '{{built: (1 + 1)}}' > {BUILT_AT}"]
    again = Template(
        apt_packages=packages,
        wheels=str(wheels),
        files={"/etc/demo/blob.bin": bytes(range(256)), "/opt/demo/hello.txt": b"hello from the template\n"},
        environment={"DEMO_TRICKY": TRICKY, "DEMO_MODE": "strict"},
        commands=commands,
    )
    proxy: Any = counting
    assert again.build(api=proxy, progress=seen) == tag
    elapsed = time.monotonic() - started
    print(f"\ncached rebuild of {tag}: {elapsed * 1000:.0f} ms (first build {first:.1f} s)")
    assert counting.builds == 0
    assert [e.kind for e in seen.events] == ["resolved", "cached"]
    assert api.inspect_image(tag)["Id"] == image_id
    # No image of this spec appeared (other sessions may build other images meanwhile).
    for image_id in {i["Id"] for i in api.images(all=True)} - before:
        assert BUILT_AT not in json.dumps(api.history(image_id)), f"a new image {image_id} of this spec"
    # The tag property agrees, through the engine.
    assert again.tag == tag


def test_a_new_wheel_means_a_new_tag(api: Any, built: tuple[str, Recorder, float], tmp_path: Path) -> None:
    tag, _, _ = built
    directory = tmp_path / "wheels"
    directory.mkdir()
    wheel = write_wheel(directory)
    assert template_of(directory).tag == tag
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("nestdemo/extra.py", "X = 1\n")
    assert template_of(directory).tag != tag


def test_a_failed_build_names_the_step_shows_its_output_and_leaves_no_layers(
    api: Any, created: list[str]
) -> None:
    marker = os.urandom(6).hex()
    template = Template(
        files={"/opt/fail/marker.txt": marker},
        commands=(f"echo ok-{marker} > /opt/fail/ok", f"echo boom-{marker}; exit 3"),
    )
    before = {i["Id"] for i in api.images(all=True)}
    with pytest.raises(BackendError) as caught:
        template.build(api=api)
    message = str(caught.value)
    assert f"run: echo boom-{marker}; exit 3" in message
    assert f"boom-{marker}" in message.splitlines()[-1]
    assert "non-zero code: 3" in message
    with pytest.raises(docker.errors.ImageNotFound):
        api.inspect_image(template.tag)
    # No layer of this build survives (other sessions may build meanwhile: look for ours).
    for image_id in {i["Id"] for i in api.images(all=True)} - before:
        history = json.dumps(api.history(image_id))
        assert marker not in history, f"failed build left {image_id}"


def test_force_rebuilds_and_removes_the_replaced_image(api: Any, created: list[str]) -> None:
    template = Template(files={"/opt/force/a.txt": os.urandom(8).hex()}, environment={"FORCED": "1"})
    tag = template.build(api=api)
    created.append(tag)
    old_id = api.inspect_image(tag)["Id"]
    seen = Recorder()
    assert template.build(api=api, progress=seen, force=True) == tag
    assert seen.events[-1].kind == "built" and seen.kinds("step")
    new_id = api.inspect_image(tag)["Id"]
    assert new_id != old_id
    with pytest.raises(docker.errors.ImageNotFound):
        api.inspect_image(old_id)


def test_a_base_without_apt_sources_gets_this_machines_mirror_and_a_rebuilt_base_a_new_tag(
    api: Any, created: list[str]
) -> None:
    from agentnest.runtime.docker.images import apt_mirror

    bare = Template(
        files={"/opt/bare/id": os.urandom(8).hex()},
        commands=("rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*",),
    )
    base_tag = bare.build(api=api)
    created.append(base_tag)
    child = Template(
        base_image=base_tag, apt_packages=("jq",), commands=("cat /etc/apt/sources.list > /opt/sources",)
    )
    seen = Recorder()
    child_tag = child.build(api=api, progress=seen)
    created.append(child_tag)
    assert any("has no apt sources" in e.message for e in seen.kinds("output"))
    with Sandbox(image=child_tag, timeout=60) as sandbox:
        assert sandbox.exec_shell("cat /opt/sources").check().stdout == f"deb {apt_mirror()} bookworm main\n"
        assert sandbox.exec_shell("jq -n 2").check().stdout == "2\n"
    # The same base name, rebuilt (a new ID): the child's tag changes with it.
    bare.build(api=api, force=True)
    assert child.tag != child_tag


def test_a_0_3_0_style_template_builds_offline_and_runs(
    api: Any, created: list[str], wheels: Path, tmp_path: Path
) -> None:
    """0.3.0's builder calls, its build(tag, client=), and what a sandbox then finds inside."""
    marker = os.urandom(6).hex()
    name = f"agentnest-compat/template-test:{marker}"
    template = (
        Template(base_image(), wheels=str(wheels))
        .apt_install("jq")
        .pip_install("nestdemo==1.0")
        .with_environment(COMPAT_MODE="0.3.0", COMPAT_MARKER=marker)
        .run(
            "mkdir -p /opt/compat && id -u > /opt/compat/built-as",
            "jq -n --arg m \"$COMPAT_MARKER\" '{marker: $m}' > /opt/compat/from-jq.json",
        )
    )
    client = docker.from_env()
    try:
        counting = CountingAPI(client.api)
        client.api = counting  # type: ignore[assignment]
        started = time.monotonic()
        assert template.build(name, client=client) == name
        print(f"\n0.3.0-style build: {time.monotonic() - started:.1f} s")
        content_tag = template.tag
        created.extend([name, content_tag])
        assert counting.builds == 1
        assert api.inspect_image(name)["Id"] == api.inspect_image(content_tag)["Id"]
        # The same spec in 0.3.0's positional order (and deprecated keywords): same tag, nothing built.
        with pytest.deprecated_call():
            again = Template(
                base_image(),
                ("nestdemo==1.0",),
                environment={"COMPAT_MARKER": marker, "COMPAT_MODE": "0.3.0"},
                commands=template.commands,
                wheels=str(wheels),
                system_packages=("jq",),
            )
        assert again.build(client=client) == content_tag
        assert counting.builds == 1
    finally:
        client.close()
    with Sandbox(image=name, timeout=60) as sandbox:
        assert sandbox.exec_shell("id -u").check().stdout.strip() == str(SANDBOX_UID)
        assert sandbox.exec_shell("jq -n '[1, 2] | add'").check().stdout.strip() == "3"
        # The run() steps ran at build time, as root, with the environment already set.
        assert sandbox.exec_shell("cat /opt/compat/built-as").check().stdout == "0\n"
        assert json.loads(sandbox.exec_shell("cat /opt/compat/from-jq.json").check().stdout) == {
            "marker": marker
        }
        env = sandbox.exec_json("import os, json; print(json.dumps(dict(os.environ)))")
        assert (env["COMPAT_MODE"], env["COMPAT_MARKER"]) == ("0.3.0", marker)
        # pip_install, from the local wheels with no index.
        assert sandbox.exec_shell("nestdemo").check().stdout.strip() == "nestdemo says 42"


def test_secrets_never_reach_the_engine() -> None:
    from agentnest import Secret
    from agentnest.errors import ConfigurationError

    environment: dict[str, Any] = {"TOKEN": Secret("s3cr3t-value")}
    with pytest.raises(ConfigurationError, match="image layers"):
        Template(environment=environment)


# -- the command line -----------------------------------------------------------------


def test_cli_builds_a_json_spec_then_finds_it_cached_and_lists_it(
    api: Any, created: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tool.py").write_text("print('tool from the spec')\n")
    spec = tmp_path / "template.json"
    spec.write_text(
        json.dumps(
            {
                "files": {"/opt/cli/tool.py": {"source": "tool.py"}, "/opt/cli/id": os.urandom(8).hex()},
                "environment": {"CLI_TEMPLATE": "yes"},
                "commands": ["python3 /opt/cli/tool.py > /opt/cli/out.txt"],
            }
        )
    )
    assert main(["image", "build", str(spec)]) == 0
    out, err = capsys.readouterr()
    tag = out.split(": ", 1)[0]
    created.append(tag)
    assert out.startswith(f"{tag}: built in ")
    assert "] run: python3 /opt/cli/tool.py > /opt/cli/out.txt\n" in err
    assert main(["image", "build", str(spec)]) == 0
    out, _ = capsys.readouterr()
    assert out == f"{tag}: cached (built before from the same spec; --force rebuilds)\n"
    assert main(["image", "build", "-q", str(spec)]) == 0
    assert capsys.readouterr().out == f"{tag}\n"
    with Sandbox(image=tag, timeout=60) as sandbox:
        assert sandbox.exec_shell("cat /opt/cli/out.txt; echo $CLI_TEMPLATE").check().stdout == (
            "tool from the spec\nyes\n"
        )
    assert main(["image", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    row = next(line for line in rows if line.startswith(tag))
    assert row.split()[1] == "template"
    base_row = next(line for line in rows if line.startswith(base_image()))
    assert base_row.split()[1] == "base"
