"""Image aliases (agentnest/runtime/docker/images.py): parsing, validation, resolution; the base recipe."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from agentnest.config import SandboxConfig
from agentnest.errors import ConfigurationError
from agentnest.runtime.docker import DockerSpec, images
from agentnest.runtime.docker.images import (
    ALIASES_ENV,
    checked_image_aliases,
    parse_image_aliases,
    resolve_image,
)

LOCAL = "agentnest/base:bookworm-0123456789ab"


def test_parse_several_entries_with_spaces_around_them() -> None:
    parsed = parse_image_aliases(
        f" python:3.12-slim={LOCAL} , registry.example:5000/team/app:1.0=app@sha256:{'a' * 64}"
    )
    assert dict(parsed) == {
        "python:3.12-slim": LOCAL,
        "registry.example:5000/team/app:1.0": f"app@sha256:{'a' * 64}",
    }
    assert isinstance(parsed, MappingProxyType)


@pytest.mark.parametrize("text", ["", "   "])
def test_parse_blank_means_no_aliases(text: str) -> None:
    assert dict(parse_image_aliases(text)) == {}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (f"python:3.12-slim={LOCAL},", "entry 2 is empty"),
        (f"a=b,,c={LOCAL}", "entry 2 is empty"),
        ("python:3.12-slim", "entry 1 ('python:3.12-slim') is not name=image"),
        (f"={LOCAL}", f"entry 1 ('={LOCAL}') is not name=image"),
        ("python:3.12-slim=", "entry 1 ('python:3.12-slim=') is not name=image"),
        ("a=b=c", "entry 1 ('a=b=c') is not name=image"),
        (f"Python:3.12={LOCAL}", "the name 'Python:3.12' is not an image reference"),
        ("python:3.12-slim=my image", "the image 'my image' is not an image reference"),
        ("python:3.12-slim=base:-bad", "the image 'base:-bad' is not an image reference"),
        (f"x={'a' * 256}", "is not an image reference"),
        (f"a={LOCAL},a=other", "'a' is aliased twice (in 'a=other')"),
        ("a=b,b=c", "'a' maps to 'b', which is itself an alias name"),
        ("a=a", "'a' maps to 'a', which is itself an alias name"),
    ],
)
def test_parse_refuses_a_bad_entry_and_names_it(text: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_image_aliases(text)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(f"{ALIASES_ENV}: ")
    assert named in str(info.value)


def test_checked_mapping_is_validated_and_frozen() -> None:
    checked = checked_image_aliases({"python:3.12-slim": LOCAL})
    assert checked == {"python:3.12-slim": LOCAL}
    assert isinstance(checked, MappingProxyType)
    for bad in (["python:3.12-slim", LOCAL], {"python:3.12-slim": 3}, {"a": "b", "b": LOCAL}, {"a b": LOCAL}):
        with pytest.raises(ConfigurationError, match=r"DockerSpec\(image_aliases=\.\.\.\)"):
            checked_image_aliases(bad)


def test_docker_spec_validates_and_freezes_its_aliases() -> None:
    assert DockerSpec().image_aliases is None  # read from the environment at create time
    source = {"python:3.12-slim": LOCAL}
    spec = DockerSpec(image_aliases=source)
    source["python:3.12-slim"] = "changed:later"
    assert spec.image_aliases == {"python:3.12-slim": LOCAL}
    assert isinstance(spec.image_aliases, MappingProxyType)
    assert DockerSpec(image_aliases={}).image_aliases == {}
    with pytest.raises(ConfigurationError, match=re.escape("'python:3.12-slim' maps to 'python:3.12-slim'")):
        DockerSpec(image_aliases={"python:3.12-slim": "python:3.12-slim"})


def test_resolve_replaces_only_an_aliased_image() -> None:
    config = SandboxConfig(image="python:3.12-slim", lifetime=60)
    resolved, info = resolve_image(config, {"python:3.12-slim": LOCAL})
    assert resolved.image == LOCAL
    assert resolved.lifetime == 60
    assert config.image == "python:3.12-slim"  # the guard's config is untouched
    assert info == {"image": LOCAL, "requested_image": "python:3.12-slim"}

    # Exact matches only: a longer spelling of the same image is not aliased.
    other = SandboxConfig(image="docker.io/library/python:3.12-slim")
    same, info = resolve_image(other, {"python:3.12-slim": LOCAL})
    assert same is other
    assert info == {"image": other.image, "requested_image": other.image}


def test_resolve_reads_the_environment_only_without_spec_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SandboxConfig(image="python:3.12-slim")
    monkeypatch.setenv(ALIASES_ENV, f"python:3.12-slim={LOCAL}")
    assert resolve_image(config, None)[0].image == LOCAL
    # Explicit spec aliases (even none) win over the environment.
    assert resolve_image(config, {})[0].image == "python:3.12-slim"
    monkeypatch.setenv(ALIASES_ENV, "python:3.12-slim")
    with pytest.raises(ConfigurationError, match=r"entry 1 .* is not name=image"):
        resolve_image(config, None)
    monkeypatch.delenv(ALIASES_ENV)
    assert resolve_image(config, None)[0] is config


def test_base_recipe_has_a_python_command_and_a_tag_that_follows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.3.0's examples run `python main.py`: Debian's python3 has no `python` without this.
    assert "python-is-python3" in images.recipe()["packages"]  # type: ignore[operator]
    tag = images.base_tag()
    assert tag == images.base_tag()
    assert images.base_image() == f"agentnest/base:{tag}"
    monkeypatch.setattr(images, "PACKAGES", ("python3",))
    assert images.base_tag() != tag
