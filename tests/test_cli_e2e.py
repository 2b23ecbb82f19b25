"""End to end through the CLI: `starter.py ask` starts its own local stack (real processes, detached),
answers with the stable --json shape, and `down` stops what it started."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.processes import free_port, pid_alive
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.e2e


def run_cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "starter.py"), *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    data_dir = tmp_path_factory.mktemp("cli-stack")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_", "OPENAI_"))},
        "TOOLLOOP_DATA_DIR": str(data_dir),
        "TOOLLOOP_TEMPORAL_PORT": str(free_port()),
        "TOOLLOOP_UI_PORT": str(free_port()),
        "TOOLLOOP_SERVICE_PORT": str(free_port()),
    }
    yield env
    # Whatever a test left running, the stack is ours: stop it by its recorded PIDs.
    run_cli(env, "down", timeout=60)


def recorded_pids(env: dict[str, str]) -> list[int]:
    state = json.loads((Path(env["TOOLLOOP_DATA_DIR"]) / "state.json").read_text())
    return [component["pid"] for component in state["components"].values()]


def test_ask_starts_the_stack_and_prints_the_stable_json_shape(cli_env: dict[str, str]) -> None:
    done = run_cli(cli_env, "ask", "--user", "u1", "--json", "Where is my order A100?")

    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert {"workflow_id", "status", "stop_reason", "final_text", "rounds", "calls"} <= set(result)
    assert (result["status"], result["stop_reason"], result["rounds"]) == ("completed", "final_answer", 2)
    assert result["final_text"].startswith("[offline model]") and "DHL" in result["final_text"]
    [record] = result["calls"]
    assert {"call_id", "tool", "ok", "code", "duration_ms"} <= set(record)
    assert (record["tool"], record["ok"], record["code"]) == ("get_order_status", True, None)
    assert len(recorded_pids(cli_env)) == 3


def test_ask_reuses_the_running_stack_and_prints_the_ui_link(cli_env: dict[str, str]) -> None:
    assert run_cli(cli_env, "up").returncode == 0
    pids_before = recorded_pids(cli_env)
    done = run_cli(cli_env, "ask", "--user", "u2", "Where is my order A100?")

    assert done.returncode == 0, done.stderr
    assert "[offline model]" in done.stdout and "A100" in done.stdout and "DHL" not in done.stdout
    ui = f"http://127.0.0.1:{cli_env['TOOLLOOP_UI_PORT']}/namespaces/default/workflows/ask-u2-"
    assert ui in done.stderr
    assert recorded_pids(cli_env) == pids_before


def test_ask_with_a_script_file_and_a_broken_script(cli_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    [
                        {
                            "type": "function_call",
                            "name": "get_ticket",
                            "arguments": '{"ticketId": "T1001"}',
                            "call_id": "t1",
                        }
                    ],
                    [{"type": "message", "content": [{"type": "output_text", "text": "Ticket read."}]}],
                ]
            }
        )
    )
    done = run_cli(cli_env, "ask", "--user", "u1", "--json", "--model", f"script:{script}", "ticket?")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["final_text"] == "Ticket read."
    assert [(c["call_id"], c["ok"]) for c in result["calls"]] == [("t1", True)]

    script.write_text('{"turns": [[{"type": "function_call", "name": "x", "arguments": {}, "call_id": "c"}]]}')
    broken = run_cli(cli_env, "ask", "--user", "u1", "--model", f"script:{script}", "ticket?")
    assert broken.returncode == 2
    assert "arguments" in broken.stderr and "Traceback" not in broken.stderr


def test_status_and_down_stop_exactly_the_recorded_processes(cli_env: dict[str, str]) -> None:
    run_cli(cli_env, "up")
    pids = recorded_pids(cli_env)
    assert pids and all(pid_alive(pid) for pid in pids)
    status = run_cli(cli_env, "status")
    assert status.returncode == 0 and status.stdout.count("running") >= 3

    down = run_cli(cli_env, "down")

    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(pid) for pid in pids)


def test_up_reports_a_taken_port_clearly(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        env = {
            **os.environ,
            "TOOLLOOP_DATA_DIR": str(tmp_path / "data"),
            "TOOLLOOP_TEMPORAL_PORT": str(taken),
            "TOOLLOOP_UI_PORT": str(free_port()),
            "TOOLLOOP_SERVICE_PORT": str(free_port()),
        }
        done = run_cli(env, "up", timeout=60)

    assert done.returncode == 2
    assert str(taken) in done.stderr and "in use" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def admin_effects(env: dict[str, str], operation_id: str) -> list[dict[str, Any]]:
    state = json.loads((Path(env["TOOLLOOP_DATA_DIR"]) / "state.json").read_text())
    response = httpx.get(
        f"http://127.0.0.1:{env['TOOLLOOP_SERVICE_PORT']}/admin/effects",
        params={"operation_id": operation_id},
        headers={"X-Admin-Token": state["admin_token"]},
    )
    response.raise_for_status()
    return list(response.json()["effects"])


def write_script(path: Path, item: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"turns": [[item], [{"type": "message", "content": "done"}]]}))
    return path


def test_ask_auto_approve_writes_once_and_reports_the_ledger(cli_env: dict[str, str], tmp_path: Path) -> None:
    note = {"ticketId": "T1003", "text": "closing remark", "expectedVersion": 1}
    script = write_script(
        tmp_path / "note.json",
        {"type": "function_call", "name": "append_ticket_note", "arguments": json.dumps(note), "call_id": "w1"},
    )
    done = run_cli(cli_env, "ask", "--user", "u1", "--json", "--auto-approve", "--model", f"script:{script}", "note")

    assert done.returncode == 0, done.stderr
    assert "--auto-approve" in done.stderr and "append_ticket_note" in done.stderr
    [op] = json.loads(done.stdout)["operations"]
    assert (op["state"], op["call_ids"], op["attempts"]) == ("verified", ["w1"], 1)
    assert op["approval"]["by"] == "u1 via cli" and op["digest"].startswith("sha256:")
    assert len(admin_effects(cli_env, op["operation_id"])) == 1


def test_approve_from_another_shell_only_as_the_requests_user(cli_env: dict[str, str], tmp_path: Path) -> None:
    refund = {"orderId": "A102", "amountCents": 150, "reason": "late delivery"}
    script = write_script(
        tmp_path / "refund.json",
        {"type": "function_call", "name": "refund_order", "arguments": json.dumps(refund), "call_id": "r1"},
    )
    ask = subprocess.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "starter.py"),
            "ask",
            "--user",
            "u1",
            "--json",
            "--model",
            f"script:{script}",
            "refund",
        ],
        env=cli_env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert ask.stderr is not None
        hint = next(line for line in ask.stderr if "starter.py approve" in line)
        workflow_id, operation_id = hint.split()[-2:]

        foreign = run_cli(cli_env, "approve", workflow_id, operation_id, "--as", "u2")
        assert foreign.returncode == 1 and "another user" in foreign.stderr
        assert admin_effects(cli_env, operation_id) == []

        approved = run_cli(cli_env, "approve", workflow_id, operation_id)
        assert approved.returncode == 0, approved.stderr
        stdout, _ = ask.communicate(timeout=120)
    finally:
        if ask.poll() is None:
            ask.kill()
            ask.wait()

    assert ask.returncode == 0
    [op] = json.loads(stdout)["operations"]
    assert op["operation_id"] == operation_id and op["state"] == "verified"
    assert op["arguments"] == refund
    [effect] = admin_effects(cli_env, operation_id)
    assert effect["kind"] == "refund"


def test_offline_model_adds_a_note_with_auto_approve_and_says_verified(cli_env: dict[str, str]) -> None:
    done = run_cli(
        cli_env, "ask", "--user", "u1", "--json", "--auto-approve", "Add a note to ticket T1002: should not be mine"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # T1002 is u2's: the read says not available and the model writes nothing.
    assert result["operations"] == [] and "did not add the note" in result["final_text"]

    done = run_cli(
        cli_env, "ask", "--user", "u1", "--json", "--auto-approve", "Add a note to ticket T1001: Customer called"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    [op] = result["operations"]
    assert op["state"] == "verified" and op["arguments"]["text"] == "Customer called"
    assert "verified" in result["final_text"] and result["final_text"].startswith("[offline model]")
    assert [c["tool"] for c in result["calls"]] == ["get_ticket", "append_ticket_note"]
    assert len(admin_effects(cli_env, op["operation_id"])) == 1


def test_ask_exits_3_when_a_side_effect_is_unknown_whatever_the_model_says(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    assert run_cli(cli_env, "up").returncode == 0
    state = json.loads((Path(cli_env["TOOLLOOP_DATA_DIR"]) / "state.json").read_text())
    faults = [
        {"method": "POST", "path_regex": "^/orders/A105/refunds$", "when": "after_commit", "action": "drop"},
        {"method": "GET", "path_regex": "^/operations/", "status": 503},
    ]
    admin = httpx.Client(
        base_url=f"http://127.0.0.1:{cli_env['TOOLLOOP_SERVICE_PORT']}", headers={"X-Admin-Token": state["admin_token"]}
    )
    with admin:
        admin.put("/admin/faults", json={"rules": faults}).raise_for_status()
        refund = {"orderId": "A105", "amountCents": 100, "reason": "damaged"}
        script = tmp_path / "refund.json"
        script.write_text(
            json.dumps(
                {
                    "turns": [
                        [
                            {
                                "type": "function_call",
                                "name": "refund_order",
                                "arguments": json.dumps(refund),
                                "call_id": "r",
                            }
                        ],
                        [{"type": "message", "content": "Refund done!"}],
                    ]
                }
            )
        )
        try:
            done = run_cli(cli_env, "ask", "--user", "u1", "--auto-approve", "--model", f"script:{script}", "refund")
        finally:
            admin.delete("/admin/faults").raise_for_status()

    assert done.returncode == 3, done.stderr
    assert "Refund done!" in done.stdout  # the model's claim is printed as its text ...
    assert "UNKNOWN" in done.stderr  # ... and the receipt says what is known
