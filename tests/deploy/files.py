"""What the deploy tests read: the paths of deploy/, and a small reader of the Dockerfile's stages."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
KUBERNETES = DEPLOY / "kubernetes"
MANIFESTS = sorted(KUBERNETES.rglob("*.yaml"))
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """A command of the dev extra, from this interpreter's environment (else PATH)."""
    found = BIN / name
    if found.exists():
        return str(found)
    on_path = shutil.which(name)
    assert on_path is not None, f"{name} is missing: pip install -e '.[dev]'"
    return on_path


@dataclass
class Stage:
    """One FROM ... AS name stage: its instructions in order, continuation lines joined."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        """ENV key=value pairs (the form hadolint asks for), later ones winning."""
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for word in shlex.split(args):
                key, sep, value = word.partition("=")
                assert sep, f"ENV {args!r}: use the key=value form"
                values[key] = value
        return values

    def exec_form(self, keyword: str) -> list[str]:
        """A JSON-array (exec form) ENTRYPOINT or CMD: the argv the container runs."""
        argv = json.loads(self.last(keyword))
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), argv
        return argv

    def healthcheck(self) -> list[str]:
        """The argv of HEALTHCHECK [options] CMD [...]."""
        args = self.last("HEALTHCHECK")
        _, sep, command = args.partition("CMD ")
        assert sep, f"HEALTHCHECK {args!r} has no CMD"
        argv = json.loads(command)
        assert isinstance(argv, list)
        return argv


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends in a continuation line"
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in lines:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            assert len(words) == 3 and words[1].upper() == "AS", f"name every stage: {line!r}"
            current = stages[words[2]] = Stage(words[2], words[0])
        else:
            assert current is not None, f"{line!r} before FROM"
            current.instructions.append((keyword, args.strip()))
    return stages


def image_env(stages: dict[str, Stage], name: str) -> dict[str, str]:
    """The environment of the image a stage makes: its ENV over that of the stages it is FROM."""
    stage = stages[name]
    inherited = image_env(stages, stage.base) if stage.base in stages else {}
    return inherited | stage.env()


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as file:
        return [doc for doc in yaml.safe_load_all(file) if doc is not None]
