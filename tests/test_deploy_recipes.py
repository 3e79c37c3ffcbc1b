"""The deployment recipes of docs/deploy/ (issue 32, item 8): the page shows
each file as it is, every process manager waits longer than
SHUTDOWN_TIMEOUT before SIGKILL, and the health checks run cogworker_status."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from django_cogworker.conf import DEFAULTS

DOCS = Path(__file__).resolve().parent.parent / "docs"
DEPLOY = DOCS / "deploy"
SHUTDOWN_TIMEOUT_S = DEFAULTS["SHUTDOWN_TIMEOUT"]
HEARTBEAT_INTERVAL_S = DEFAULTS["HEARTBEAT_INTERVAL"]
RECIPES = ("Dockerfile", "compose.yaml", "cogworker.service", "k8s.yaml")


def read(name: str) -> str:
    return (DEPLOY / name).read_text()


def fences(markdown: str) -> list[str]:
    return re.findall(r"^```[\w-]*\n(.*?)^```$", markdown, re.S | re.M)


def shutdown_timeout_of(command: list[str]) -> float:
    """The worker's own shutdown timeout: -t/--shutdown-timeout, else the default."""
    for flag in ("-t", "--shutdown-timeout"):
        if flag in command:
            return float(command[command.index(flag) + 1])
    return float(SHUTDOWN_TIMEOUT_S)


def yaml_block(text: str, key: str) -> str:
    """The lines nested under ``key:`` (the recipes' YAML is plain block style)."""
    match = re.search(rf"^( *){re.escape(key)}:\n((?:\1 +.*\n)+)", text, re.M)
    assert match, f"no {key}: block"
    return match.group(2)


def exec_list(line: str) -> list[str]:
    """A JSON-style list on one line: an exec-form command."""
    return list(json.loads(line[line.index("[") :]))


@pytest.mark.parametrize("name", RECIPES)
def test_the_deployment_page_shows_each_recipe_as_it_is(name):
    page = (DOCS / "deployment.md").read_text()
    assert read(name) in fences(page)
    assert f"(deploy/{name})" in page


def test_the_dockerfile_runs_the_worker_in_exec_form_and_stops_it_with_sigterm():
    text = read("Dockerfile")
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M)
    cmd = next(line for line in text.splitlines() if line.startswith("CMD "))
    assert exec_list(cmd)[1:3] == ["manage.py", "cogworker"]


def test_compose_waits_longer_than_the_shutdown_timeout_and_checks_health_with_cogworker_status():
    worker = yaml_block(read("compose.yaml"), "  worker")
    command = exec_list(next(line for line in worker.splitlines() if "command:" in line))
    assert command[1:3] == ["manage.py", "cogworker"]
    grace = re.search(r"^ +stop_grace_period: (\d+)s$", worker, re.M)
    assert grace and int(grace.group(1)) > shutdown_timeout_of(command)
    health = yaml_block(worker, "    healthcheck")
    test = exec_list(next(line for line in health.splitlines() if "test:" in line))
    assert test == ["CMD", "python", "manage.py", "cogworker_status"]
    redis = yaml_block(read("compose.yaml"), "  redis")
    assert '"--appendonly", "yes"' in redis and '"--maxmemory-policy", "noeviction"' in redis


def test_the_systemd_unit_waits_longer_than_the_shutdown_timeout():
    text = read("cogworker.service")
    start = re.search(r"^ExecStart=(.+)$", text, re.M)
    assert start
    command = start.group(1).split()
    assert command[1:3] == ["manage.py", "cogworker"]
    stop = re.search(r"^TimeoutStopSec=(\d+)$", text, re.M)
    assert stop and int(stop.group(1)) > shutdown_timeout_of(command)
    assert re.search(r"^KillSignal=SIGTERM$", text, re.M) and re.search(r"^KillMode=mixed$", text, re.M)


def test_the_kubernetes_deployment_waits_longer_than_the_shutdown_timeout_and_probes_with_cogworker_status():
    text = read("k8s.yaml")
    command = exec_list(next(line for line in text.splitlines() if line.strip().startswith("command: [")))
    assert command[1:3] == ["manage.py", "cogworker"]
    grace = re.search(r"^ +terminationGracePeriodSeconds: (\d+)", text, re.M)
    assert grace and int(grace.group(1)) > shutdown_timeout_of(command)
    for probe in ("startupProbe", "readinessProbe"):
        block = yaml_block(text, f"          {probe}")
        probe_command = exec_list(next(line for line in block.splitlines() if "command:" in line))
        assert probe_command == ["python", "manage.py", "cogworker_status"], probe
        # A run starts Django before it reads Redis: Kubernetes' default of 1 s is too short.
        timeout = re.search(r"timeoutSeconds: (\d+)", block)
        assert timeout and int(timeout.group(1)) >= 5, probe
    period = re.search(r"periodSeconds: (\d+)", yaml_block(text, "          readinessProbe"))
    assert period and int(period.group(1)) > HEARTBEAT_INTERVAL_S
