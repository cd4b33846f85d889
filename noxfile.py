"""Run the test suite against every supported torch release, and lint.

``nox -l`` lists the sessions; ``nox -s tests-2.15`` runs one; ``nox`` alone runs the quick
default (torch 2.13 plus lint). Extra arguments go to pytest: ``nox -s tests-2.13 -- -k doctor``.
Each torch release gets its own reused virtualenv, since a torch install is gigabytes.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping

import nox

# The machine's interpreter when it is there; otherwise the one running nox.
PYTHON = "3.11" if shutil.which("python3.11") else None

# torch release -> environment for its pip installs. 2.13.0 is a local CPU wheel; 2.11.0,
# 2.12.1, 2.14.1 and 2.15.0 are CUDA builds from PyPI (large) that run on CPU. The machine's global
# pip config caps torch at 2.14.1, so 2.15.0 installs with that config switched off.
TORCH: dict[str, Mapping[str, str]] = {
    "2.11.0": {},
    "2.12.1": {},
    "2.13.0": {},
    "2.14.1": {},
    "2.15.0": {"PIP_CONFIG_FILE": "/dev/null"},
}
TEST_COMMAND = ("python", "-m", "pytest", "-n", "2", "-q")  # the README's test command

nox.options.sessions = ["tests-2.13", "lint", "docs"]
nox.options.reuse_existing_virtualenvs = True


def _tests_session(version: str, pip_env: Mapping[str, str]) -> Callable[[nox.Session], None]:
    """One ``tests-<minor>`` session: install that torch, the package, then run the suite."""
    minor = ".".join(version.split(".")[:2])

    @nox.session(name=f"tests-{minor}", python=PYTHON)
    def tests(session: nox.Session) -> None:
        session.install(f"torch=={version}", env=dict(pip_env))
        # Same env here: with the cap on, pip would downgrade the torch just installed.
        session.install("-e", ".[test]", env=dict(pip_env))
        session.run(*TEST_COMMAND, *session.posargs)

    tests.__doc__ = f"pytest against torch {version}."
    return tests


for _version, _env in TORCH.items():
    _tests_session(_version, _env)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff and mypy, with torch installed so mypy sees the same types as a dev env."""
    session.install("torch==2.13.0", "-e", ".[dev]")
    session.run("ruff", "check", ".")
    session.run("mypy")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The docs site, as CI builds it: every warning (a broken link, a missing page) fails."""
    session.install("torch==2.13.0", "-e", ".[docs]")
    session.run("mkdocs", "build", "--strict")
