"""End to end through the CLI: `starter.py ask` starts its own local stack (real processes, detached),
answers with the stable --json shape, and `down` stops what it started."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest
from temporalio.client import Client

import toolloop
from devstack.processes import free_port, pid_alive, port_accepts, run_coroutine_blocking, temporal_binary
from tests.conftest import APPROVAL_KEY, REPO_ROOT, TemporalServer
from tests.fake_openai_server import FakeOpenAIServer, output_message, responses_response
from toolloop._core.contracts import OperationRecord
from toolloop._core.names import GET_LEDGER_QUERY
from toolloop._core.request_naming import request_workflow_id
from toolloop._temporal.converter import data_converter

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


def stack_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a local stack of its own: this process's, without its toolloop, Temporal and model
    settings, with a data dir and free ports (and `settings` over them)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_", "OPENAI_"))},
        "TOOLLOOP_DATA_DIR": str(data_dir),
        "TOOLLOOP_TEMPORAL_PORT": str(free_port()),
        "TOOLLOOP_UI_PORT": str(free_port()),
        "TOOLLOOP_SERVICE_PORT": str(free_port()),
        "TOOLLOOP_API_PORT": str(free_port()),
        **settings,
    }


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    env = stack_env(tmp_path_factory.mktemp("cli-stack"))
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
    # The UI's default list shows workflow ids: this one says what was asked.
    assert re.fullmatch(r"ask-acme-u1-where-is-my-order-a100-[0-9a-f]{8}-[0-9a-f]{12}", result["workflow_id"])
    assert result["final_text"].startswith("[offline model]") and "DHL" in result["final_text"]
    [record] = result["calls"]
    assert {"call_id", "tool", "ok", "code", "duration_ms"} <= set(record)
    assert (record["tool"], record["ok"], record["code"]) == ("get_order_status", True, None)
    assert len(recorded_pids(cli_env)) == 4  # dev server, service, worker, API
    # The first ask started the stack, and says that it keeps running and how to stop it.
    assert "keeps running in the background" in done.stderr and " down" in done.stderr


def test_ask_reuses_the_running_stack_and_prints_the_ui_link(cli_env: dict[str, str]) -> None:
    assert run_cli(cli_env, "up").returncode == 0
    pids_before = recorded_pids(cli_env)
    done = run_cli(cli_env, "ask", "--user", "u2", "Where is my order A100?")

    # A100 is u1's: the service refuses u2's read, so the request is answered but not served (exit 4).
    assert done.returncode == 4, done.stderr
    assert "[offline model]" in done.stdout and "A100" in done.stdout and "DHL" not in done.stdout
    ui = f"http://127.0.0.1:{cli_env['TOOLLOOP_UI_PORT']}/namespaces/default/workflows/ask-acme-u2-"
    assert ui in done.stderr
    assert recorded_pids(cli_env) == pids_before
    assert "keeps running in the background" not in done.stderr  # it started nothing


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


LABELS = ("Temporal dev server", "business service", "worker", "HTTP API")


def test_status_and_down_stop_exactly_the_recorded_processes(cli_env: dict[str, str]) -> None:
    assert run_cli(cli_env, "up").returncode == 0
    pids = recorded_pids(cli_env)
    assert pids and all(pid_alive(pid) for pid in pids)
    status = run_cli(cli_env, "status")
    assert status.returncode == 0, status.stderr
    for label in LABELS:
        assert re.search(rf"^{label}: running \(pid \d+, ", status.stdout, re.MULTILINE), status.stdout
    assert f"Temporal UI: http://127.0.0.1:{cli_env['TOOLLOOP_UI_PORT']}" in status.stdout

    # The same data dir with other ports: its recorded processes are the stack, and down says it stopped each.
    other_ports = {**cli_env, "TOOLLOOP_TEMPORAL_PORT": str(free_port()), "TOOLLOOP_SERVICE_PORT": str(free_port())}
    down = run_cli(other_ports, "down")

    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(pid) for pid in pids)
    stopped = re.findall(r"^stopped (.+) \(pid (\d+), ", down.stdout, re.MULTILINE)
    assert sorted(stopped) == sorted(zip(LABELS, map(str, pids), strict=True)), down.stdout
    assert f"127.0.0.1:{cli_env['TOOLLOOP_TEMPORAL_PORT']}" in down.stdout  # where it really ran

    # Nothing is left to stop: one line, exit 1; status says nothing runs and shows no UI link.
    again = run_cli(cli_env, "down")
    assert again.returncode == 1 and again.stdout == ""
    [line] = again.stderr.strip().splitlines()
    assert line.startswith(f"error: stopped nothing: no process of data dir {cli_env['TOOLLOOP_DATA_DIR']} runs")
    status = run_cli(cli_env, "status")
    assert status.returncode == 0, status.stderr
    assert not re.search(r": running \(|^Temporal UI", status.stdout, re.MULTILINE), status.stdout


@pytest.mark.parametrize("ports", ["same ports", "other ports"])
def test_down_and_status_under_other_settings_claim_nothing_they_did_not_do(
    cli_env: dict[str, str], tmp_path: Path, ports: str
) -> None:
    assert run_cli(cli_env, "up").returncode == 0
    pids = recorded_pids(cli_env)
    elsewhere = {**cli_env, "TOOLLOOP_DATA_DIR": str(tmp_path / "elsewhere")}
    if ports == "other ports":
        elsewhere |= {name: str(free_port()) for name in cli_env if name.endswith("_PORT")}

    status = run_cli(elsewhere, "status")
    down = run_cli(elsewhere, "down")

    # The real stack keeps running, and neither command claims to have seen or stopped it.
    assert all(pid_alive(pid) for pid in pids)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(f"none recorded in data dir {tmp_path / 'elsewhere'}") == 4, status.stdout
    assert not re.search(r": running \(|^stopped |^Temporal UI", status.stdout, re.MULTILINE), status.stdout
    assert down.returncode == 1 and down.stdout == "", down.stdout
    [line] = down.stderr.strip().splitlines()
    assert line.startswith(f"error: stopped nothing: no process of data dir {tmp_path / 'elsewhere'} runs")
    temporal_port = f"port {cli_env['TOOLLOOP_TEMPORAL_PORT']} (Temporal gRPC, TOOLLOOP_TEMPORAL_PORT)"
    if ports == "same ports":
        # What it did check: the ports these settings name are held by processes this data dir did not start.
        assert temporal_port in line and "is held by a process this data dir did not start" in line
        assert temporal_port in status.stdout
    else:
        assert line.endswith("nothing listens on the ports these settings name")
    assert not (tmp_path / "elsewhere").exists()  # down created no state where there was none


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


def test_a_failed_up_leaves_nothing_running(tmp_path: Path) -> None:
    # Temporal starts fine; the service's port is taken, so `up` fails after Temporal is up.
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        temporal_port = free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_"))},
            "TOOLLOOP_DATA_DIR": str(tmp_path / "data"),
            "TOOLLOOP_TEMPORAL_PORT": str(temporal_port),
            "TOOLLOOP_UI_PORT": str(free_port()),
            "TOOLLOOP_SERVICE_PORT": str(taken),
        }
        done = run_cli(env, "up", timeout=120)

    assert done.returncode == 2, done.stderr
    assert str(taken) in done.stderr and "in use" in done.stderr
    state = json.loads((tmp_path / "data" / "state.json").read_text())
    assert state["components"] == {}
    assert not port_accepts(temporal_port)  # the dev server it started was stopped again
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path) not in processes  # nothing of this data dir runs any more


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


def ask_process(cli_env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """`ask --user u1 --json ARGS` running in the background, its output piped."""
    return subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "starter.py"), "ask", "--user", "u1", "--json", *args],
        env=cli_env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def refund_waiting_for_approval(
    cli_env: dict[str, str], tmp_path: Path, refund: dict[str, Any]
) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    """`ask --json` with a scripted refund, once it waits for approval: the process, and the workflow and
    operation ids from the hint it prints; killed on the way out if it is still running."""
    script = write_script(
        tmp_path / "refund.json",
        {"type": "function_call", "name": "refund_order", "arguments": json.dumps(refund), "call_id": "r1"},
    )
    ask = ask_process(cli_env, "--model", f"script:{script}", "refund")
    try:
        assert ask.stderr is not None
        hint = next(line for line in ask.stderr if " approve " in line)
        workflow_id, operation_id = hint.split(" approve ")[1].split()[:2]
        yield ask, workflow_id, operation_id
    finally:
        if ask.poll() is None:
            ask.kill()
            ask.wait()


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
    refund = {"orderId": "A102", "amountCents": 150, "reason": "late delivery", "toAccount": None}
    with refund_waiting_for_approval(cli_env, tmp_path, refund) as (ask, workflow_id, operation_id):
        # Another user, or the same user id in another tenant, is told what a missing request gets.
        for who in (["--user", "u2"], ["--user", "u1", "--tenant", "globex"]):
            missing = run_cli(cli_env, "approve", "ask-acme-u1-nope-0", operation_id, *who)
            foreign = run_cli(cli_env, "approve", workflow_id, operation_id, *who)
            assert foreign.returncode == missing.returncode == 2
            assert foreign.stderr.replace(workflow_id, "X") == missing.stderr.replace("ask-acme-u1-nope-0", "X")
            assert "refund_order" not in foreign.stderr and "A102" not in foreign.stderr  # nothing shown
        assert admin_effects(cli_env, operation_id) == []
        # An operation the request does not have: one line naming those it has, nothing decided.
        nope = "op_" + "f" * 32
        unknown = run_cli(cli_env, "approve", workflow_id, nope, "--user", "u1")
        assert unknown.returncode == 2
        assert unknown.stderr.strip() == f"error: request {workflow_id} has no operation {nope}; it has: {operation_id}"

        approved = run_cli(cli_env, "approve", workflow_id, operation_id, "--user", "u1")
        assert approved.returncode == 0, approved.stderr
        assert json.dumps(refund, sort_keys=True) in approved.stderr  # the whole payload was shown
        stdout, _ = ask.communicate(timeout=120)

    assert ask.returncode == 0
    [op] = json.loads(stdout)["operations"]
    assert op["operation_id"] == operation_id and op["state"] == "verified"
    assert op["arguments"] == refund
    assert op["approval"]["by"] == "u1 via cli"
    [effect] = admin_effects(cli_env, operation_id)
    assert effect["kind"] == "refund"
    # Its result, asked for by id from another shell: the same receipt and exit code as ask's; another user's
    # request looks like a missing one.
    again_result = run_cli(cli_env, "result", workflow_id, "--user", "u1", "--json")
    assert again_result.returncode == 0, again_result.stderr
    assert json.loads(again_result.stdout) == json.loads(stdout)
    theirs = run_cli(cli_env, "result", workflow_id, "--user", "u2")
    missing = run_cli(cli_env, "result", "ask-acme-u1-nope-0", "--user", "u2")
    assert theirs.returncode == missing.returncode == 2
    assert theirs.stderr.replace(workflow_id, "X") == missing.stderr.replace("ask-acme-u1-nope-0", "X")
    # The request has finished: deciding again is one line saying so, exit 1, and nothing is shown or sent.
    again = run_cli(cli_env, "approve", workflow_id, operation_id, "--user", "u1")
    assert again.returncode == 1
    assert again.stderr.strip() == f"error: request {workflow_id} has finished (completed); it takes no more decisions"
    assert len(admin_effects(cli_env, operation_id)) == 1


def test_a_note_on_someone_elses_ticket_is_not_done_and_exits_4(cli_env: dict[str, str]) -> None:
    done = run_cli(
        cli_env, "ask", "--user", "u1", "--json", "--auto-approve", "Add a note to ticket T1002: should not be mine"
    )
    # T1002 is u2's: the read the note needs is refused, the model writes nothing, and the requested note was
    # not added: exit 4, not 0.
    assert done.returncode == 4, done.stderr
    result = json.loads(done.stdout)
    assert result["operations"] == [] and "did not add the note" in result["final_text"]
    assert [(c["tool"], c["code"]) for c in result["calls"]] == [("get_ticket", "NOT_AVAILABLE")]


def test_a_refund_the_user_asks_not_to_make_is_never_proposed(cli_env: dict[str, str]) -> None:
    # --auto-approve: a refund proposed here would be made.
    done = run_cli(
        cli_env, "ask", "--user", "u1", "--json", "--auto-approve", "I don't want you to refund 5 EUR on order A100"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["calls"], result["operations"]) == ([], [])
    assert "I will not refund anything on order A100" in result["final_text"]
    with service_admin(cli_env) as admin:
        refunds = admin.get("/orders/A100/refunds", headers={"X-Actor-User": "u1", "X-Actor-Tenant": "acme"})
    assert refunds.status_code == 200 and refunds.json()["refunds"] == [], refunds.text


def test_offline_model_adds_a_note_with_auto_approve_and_says_verified(cli_env: dict[str, str]) -> None:
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


def service_admin(env: dict[str, str]) -> httpx.Client:
    state = json.loads((Path(env["TOOLLOOP_DATA_DIR"]) / "state.json").read_text())
    return httpx.Client(
        base_url=f"http://127.0.0.1:{env['TOOLLOOP_SERVICE_PORT']}", headers={"X-Admin-Token": state["admin_token"]}
    )


def refund_script(path: Path, refund: dict[str, Any], answer: str = "Refund done!") -> Path:
    item = {"type": "function_call", "name": "refund_order", "arguments": json.dumps(refund), "call_id": "r"}
    path.write_text(json.dumps({"turns": [[item], [{"type": "message", "content": answer}]]}))
    return path


@pytest.mark.parametrize(
    ("faults", "state"),
    [
        (
            [
                {"method": "POST", "path_regex": "^/orders/A105/refunds$", "when": "after_commit", "action": "drop"},
                {"method": "GET", "path_regex": "^/operations/", "status": 503},
            ],
            "unknown",
        ),
        # The read-back cannot see the refund: done per the service, not verified (issue 11, bug 1).
        ([{"method": "GET", "path_regex": "^/orders/A105/refunds$", "status": 503}], "completed"),
    ],
    ids=["unknown", "unverified"],
)
def test_ask_exits_3_when_a_side_effect_is_unknown_or_unverified_whatever_the_model_says(
    cli_env: dict[str, str], tmp_path: Path, faults: list[dict[str, Any]], state: str
) -> None:
    assert run_cli(cli_env, "up").returncode == 0
    with service_admin(cli_env) as admin:
        admin.put("/admin/faults", json={"rules": faults}).raise_for_status()
        script = refund_script(tmp_path / "refund.json", {"orderId": "A105", "amountCents": 100, "reason": "damaged"})
        try:
            done = run_cli(cli_env, "ask", "--user", "u1", "--auto-approve", "--model", f"script:{script}", "refund")
            as_json = run_cli(
                cli_env,
                "ask",
                "--user",
                "u1",
                "--json",
                "--request-id",
                f"exit3-{state}",
                "--auto-approve",
                "--model",
                f"script:{script}",
                "refund",
            )
        finally:
            admin.delete("/admin/faults").raise_for_status()

    assert done.returncode == 3, done.stderr
    assert "Refund done!" in done.stdout  # the model's claim is printed as its text ...
    words = {"unknown": "UNKNOWN whether it happened", "completed": "done per the service, NOT verified"}[state]
    assert words in done.stderr  # ... and the receipt says what is known
    assert as_json.returncode == 3, as_json.stderr
    [op] = json.loads(as_json.stdout)["operations"]
    assert op["state"] == state and op["attempts"] == 1
    assert len(admin_effects(cli_env, op["operation_id"])) == 1  # it did happen, exactly once


def test_ask_exits_4_when_it_answered_but_the_write_was_not_done(cli_env: dict[str, str], tmp_path: Path) -> None:
    script = refund_script(tmp_path / "refund.json", {"orderId": "A106", "amountCents": 100, "reason": "x"}, "OK.")
    done = run_cli(
        cli_env, "ask", "--user", "u1", "--json", "--approval-ttl-seconds", "1", "--model", f"script:{script}", "r"
    )
    assert done.returncode == 4, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], [op["state"] for op in result["operations"]]) == ("completed", ["expired"])
    assert admin_effects(cli_env, result["operations"][0]["operation_id"]) == []


def test_the_receipt_keeps_the_exact_payload_when_piped(cli_env: dict[str, str], tmp_path: Path) -> None:
    reason = "the parcel arrived soaked through and the customer asked twice already " * 2
    refund = {"orderId": "A107", "amountCents": 321, "reason": reason.strip(), "toAccount": None}
    script = refund_script(tmp_path / "refund.json", refund)
    done = run_cli(cli_env, "ask", "--user", "u1", "--auto-approve", "--model", f"script:{script}", "refund")

    assert done.returncode == 0, done.stderr
    receipt = done.stderr[done.stderr.index("Receipt") :]
    assert json.dumps(refund, ensure_ascii=False, sort_keys=True) in receipt
    assert "refund_order op_" in receipt and "done, verified by read-back" in receipt
    assert "…" not in receipt


def test_a_request_id_is_scoped_by_tenant_and_user_and_never_runs_twice(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    script = refund_script(tmp_path / "refund.json", {"orderId": "A108", "amountCents": 200, "reason": "once"})
    args = ["--json", "--request-id", "same-id", "--auto-approve", "--model", f"script:{script}"]
    first = run_cli(cli_env, "ask", "--user", "u1", *args, "refund A108")
    assert first.returncode == 0, first.stderr
    one = json.loads(first.stdout)
    [op] = one["operations"]

    # The same id and question again, even after the run completed, gives back the first run: no second
    # approval, and it says so.
    same = run_cli(cli_env, "ask", "--user", "u1", *args, "refund A108")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout) == one
    assert "--auto-approve" not in same.stderr  # nothing was asked
    assert "request same-id exists already: showing its run (the same question, not asked again)" in same.stderr
    # The same id with another question is refused in one line (exit 2): never the first run shown as its
    # answer, nor anything of it approved; the command it prints shows the first run.
    again = run_cli(cli_env, "ask", "--user", "u1", *args, "refund it again")
    assert again.returncode == 2 and again.stdout == ""
    [line] = again.stderr.strip().splitlines()
    assert line.startswith("error: request same-id was started with another question;"), line
    shown = shlex.split(line[line.index("`") + 1 : line.rindex("`")])
    printed = subprocess.run([*shown, "--json"], env=cli_env, capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and json.loads(printed.stdout) == one, printed.stderr
    assert len(admin_effects(cli_env, op["operation_id"])) == 1

    # The same user id in another tenant is another person: their own request, never the first one.
    other = run_cli(
        cli_env,
        "ask",
        "--user",
        "u1",
        "--tenant",
        "globex",
        "--json",
        "--request-id",
        "same-id",
        "--auto-approve",
        "--model",
        f"script:{script}",
        "refund A108",
    )
    theirs = json.loads(other.stdout)
    assert theirs["workflow_id"] != one["workflow_id"] and "globex" in theirs["workflow_id"]
    assert theirs["final_text"] == one["final_text"]  # the script's words, but ...
    assert [o["state"] for o in theirs["operations"]] == ["failed"]  # ... A108 is not theirs: nothing was done
    assert theirs["operations"][0]["operation_id"] != op["operation_id"]


def test_a_new_thread_prints_its_id_and_the_follow_up_command_runs_as_printed(cli_env: dict[str, str]) -> None:
    first = run_cli(cli_env, "ask", "--user", "u1", "--thread", "new", "Where is my order A100?")
    assert first.returncode == 0, first.stderr
    [started] = re.findall(r"thread (\S+), message 1", first.stderr)
    [printed] = [line for line in first.stderr.splitlines() if line.startswith("Continue this thread with: ")]
    command = shlex.split(printed.removeprefix("Continue this thread with: "))
    assert command[-3:] == ["--thread", started, "QUESTION"]
    # The printed command, run as printed from a plain shell: the thread's second message.
    second = subprocess.run(command, env=cli_env, capture_output=True, text=True, timeout=180, check=False)
    assert second.returncode in (0, 4), second.stderr
    assert f"thread {started}, message 2" in second.stderr
    # Both are requests of the thread, shown to the second in order.
    as_json = run_cli(cli_env, "ask", "--user", "u1", "--thread", started, "--json", "Where is my order A100?")
    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    assert result["thread_id"] == started and "DHL" in result["final_text"]
    assert f"thread {started}, message 3" in as_json.stderr
    # Closed, the thread takes no new message: one line, and the exit status of a refusal.
    closed = run_cli(cli_env, "close-thread", "--user", "u1", started)
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout.startswith(f"Closed thread {started}: 3 messages;")
    after = run_cli(cli_env, "ask", "--user", "u1", "--thread", started, "Where is my order A100?")
    assert after.returncode == 1 and after.stderr.strip() == (
        f"error: thread {started} has been closed; start another thread"
    ), after.stderr
    # Its messages have run, so it ends: closing it then says so (asked until its workflow has ended).
    for _ in range(30):
        again = run_cli(cli_env, "close-thread", "--user", "u1", started)
        assert again.returncode == 0, again.stderr
        if "had already ended" in again.stdout:
            break
    assert again.stdout.strip() == f"Thread {started} had already ended: 3 messages."
    # Another user's thread looks like a missing one.
    theirs = run_cli(cli_env, "close-thread", "--user", "u2", started)
    assert theirs.returncode == 2
    assert theirs.stderr.strip() == f"error: no thread {started} for user 'u2' in tenant 'acme'", theirs.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ask", "--user", "u1", "   "], "the question is empty"),
        (["ask", "--user", "", "hi"], "--user: must not be empty"),
        (["ask", "--user", "u1", "--max-rounds", "0", "hi"], "--max-rounds"),
        (["ask", "--user", "u1", "--deadline-seconds", "-5", "hi"], "--deadline-seconds"),
        (["ask", "--user", "u1", "--max-total-tokens", "0", "hi"], "--max-total-tokens"),
        (["ask", "--user", "u1", "--max-cost", "-1", "hi"], "--max-cost"),
        (["ask", "--user", "ghost", "hi"], "unknown user 'ghost' in tenant 'acme'"),
        (["ask", "--user", "u2", "--tenant", "globex", "hi"], "unknown user 'u2' in tenant 'globex'"),
        (["ask", "--user", "u\u0131", "hi"], "--user"),
        (["ask", "--user", "u1", "--request-id", "a b", "hi"], "--request-id"),
        (["ask", "--user", "u1", "--thread", "a b", "hi"], "--thread: 'new', or 1-64 ASCII letters"),
        (["close-thread", "--user", "u1", "a b"], "THREAD_ID: 1-64 ASCII letters"),
        (
            ["ask", "--user", "u1", "--allow-tool", "nosuch", "hi"],
            "--allow-tool 'nosuch': the local stack's worker has",
        ),
        (["ask", "--user", "u1", "--model", "nosuch", "hi"], "--model 'nosuch': the local stack's worker has no such"),
        (["ask", "hi"], "--user"),
        (["ask", "--user", "u1", "--no-local-stack", "--auto-approve", "hi"], "--auto-approve needs"),
        (["approve", "wf", "op"], "--user is required"),
        (["reject", "wf", "op_" + "0" * 32, "--user", "u1", "--no-local-stack"], "no approval key"),
        # Not valid text (a byte that is not UTF-8 arrives as a lone surrogate): before, a traceback (exit 1).
        (["approve", "wf", "op_\\udcff", "--user", "u1"], "is not an operation id"),
        (["reject", "wf", "op_1", "--user", "u1"], "is not an operation id"),
        (["nonsense"], "No such command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli_env: dict[str, str], args: list[str], message: str) -> None:
    env = {k: v for k, v in cli_env.items() if k != "TOOLLOOP_APPROVAL_KEY"}
    args = [a.encode().decode("unicode_escape") for a in args]
    done = run_cli(env, *args, timeout=60)  # never the approval TTL: refused at once

    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "validation error" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("command", ["approve", "reject"])
def test_a_malformed_approval_key_is_one_line_and_exit_2_when_deciding(cli_env: dict[str, str], command: str) -> None:
    # `ask` checked the key; `approve` and `reject` printed the approval card, then a traceback (exit 1).
    env = {**cli_env, "TOOLLOOP_APPROVAL_KEY": "not-a-key"}
    done = run_cli(env, command, "wf", "op_" + "0" * 32, "--user", "u1", "--no-local-stack", timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: TOOLLOOP_APPROVAL_KEY: "), done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "large:other-model",
            "--model large:other-model: 'large' is a configured model that serves one provider model",
        ),
        (
            "nosuch",
            "--model 'nosuch': the local stack's worker has no such model; "
            "it has large, offline, openai, script, small",
        ),
    ],
)
def test_a_named_models_other_model_or_an_unknown_one_is_one_line_and_exit_2(
    cli_env: dict[str, str], model: str, message: str
) -> None:
    # The local stack's named models (TOOLLOOP_MODELS) are the CLI's to use, each as its one configured model.
    env = {
        **cli_env,
        "OPENAI_API_KEY": "sk-test-cli-named-0123456789",
        "LARGE_API_KEY": "sk-test-cli-large-0123456789",
        "TOOLLOOP_MODELS": json.dumps({"small": {"model": "m-small"}, "large": {"api_key_env": "LARGE_API_KEY"}}),
    }
    done = run_cli(env, "ask", "--user", "u1", "--model", model, "hi", timeout=60)

    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "" and "sk-test" not in done.stderr


def test_a_bad_named_model_table_stops_the_cli_in_one_line(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "TOOLLOOP_MODELS": json.dumps({"large": {"api_key_env": "NO_SUCH_KEY_VARIABLE_X"}})}
    done = run_cli(env, "ask", "--user", "u1", "hi", timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("error: TOOLLOOP_MODELS: ") and "NO_SUCH_KEY_VARIABLE_X is not set" in line, line


# --- The approval prompt on a terminal (a real pty) ------------------------------------------------------


def _interruptible() -> None:
    # A terminal's foreground job gets Ctrl-C; a test run started in the background (`cmd &` in a script)
    # has SIGINT ignored, and an ignored signal stays ignored across exec.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


TERMINAL_COLUMNS = 250


def spawn_ask(env: dict[str, str], *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        [str(REPO_ROOT / "starter.py"), "ask", *args],
        env=env,
        cwd=str(REPO_ROOT),
        encoding="utf-8",
        timeout=90,
        dimensions=(50, TERMINAL_COLUMNS),
        preexec_fn=_interruptible,
    )
    # Everything it wrote, escape sequences included: what the terminal shows is rendered from it.
    child.logfile_read = io.StringIO()
    return child


_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


def screen_of(output: str, columns: int = TERMINAL_COLUMNS) -> list[str]:
    """The lines a terminal shows once `output` is written to it (scrollback included): characters, CR, LF,
    line wrap, and the cursor and erase sequences rich's live display uses. Another sequence fails the test
    rather than being rendered wrongly."""
    lines: list[list[str]] = [[]]
    row = col = 0
    index = 0
    while index < len(output):
        char = output[index]
        if char == "\x1b":
            found = _CSI.match(output, index)
            assert found is not None, f"unexpected escape sequence {output[index : index + 12]!r}"
            params, command = found.groups()
            count = int(params) if params.isdigit() else 1
            if command == "A":
                row = max(0, row - count)
            elif command == "B":
                row += count
            elif command == "G":
                col = count - 1
            elif command == "K":
                while len(lines) <= row:
                    lines.append([])
                lines[row] = [] if params == "2" else lines[row][: col if params in ("", "0") else None]
            elif command not in "mhl":  # colours, cursor shown or hidden
                raise AssertionError(f"unexpected escape sequence {found.group(0)!r}")
            index = found.end()
            continue
        index += 1
        if char == "\r":
            col = 0
        elif char == "\n":
            row += 1
        elif char >= " ":
            if col >= columns:  # the terminal wraps at its width
                row, col = row + 1, 0
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = char
            col += 1
    return ["".join(line).rstrip() for line in lines]


def line_with(screen: list[str], text: str) -> int:
    """The first line of the screen that shows `text`."""
    found = [index for index, line in enumerate(screen) if text in line]
    assert found, f"{text!r} is not on the screen:\n" + "\n".join(screen)
    return found[0]


def shown_commands(child: pexpect.spawn) -> tuple[str, str]:
    """The approve and reject commands printed before the prompt (the prompt must come after them)."""
    child.expect(r"approve:\s+(\S.*? approve \S+ \S+ --user \S+ --tenant [A-Za-z0-9_.@-]+)")
    approve = child.match.group(1)
    child.expect(r"reject:\s+(\S.*? reject \S+ \S+ --user \S+ --tenant [A-Za-z0-9_.@-]+)")
    reject = child.match.group(1)
    child.expect(r"Approve this exact operation\? \[y/N\]")
    return approve, reject


def plain_shell(env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    """Run a printed command as a user would from a new shell: no venv on PATH, another directory."""
    # None of this test's TOOLLOOP_* settings: a printed command must name what it needs itself.
    plain = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    return subprocess.run(
        command, shell=True, env=plain, cwd="/", capture_output=True, text=True, timeout=120, check=False
    )


def ledger_of(env: dict[str, str], workflow_id: str) -> list[dict[str, Any]]:
    """The request's operations as the workflow holds them (its get_ledger query)."""

    async def query() -> list[dict[str, Any]]:
        client = await Client.connect(f"127.0.0.1:{env['TOOLLOOP_TEMPORAL_PORT']}", data_converter=data_converter())
        ops = await client.get_workflow_handle(workflow_id).query(GET_LEDGER_QUERY, result_type=list[OperationRecord])
        return [op.model_dump(mode="json") for op in ops]

    return run_coroutine_blocking(query)


def test_the_prompt_ends_at_once_when_approved_from_a_plain_shell(cli_env: dict[str, str], tmp_path: Path) -> None:
    script = refund_script(tmp_path / "r.json", {"orderId": "A109", "amountCents": 110, "reason": "prompt"}, "Done.")
    child = spawn_ask(cli_env, "--user", "u1", "--model", f"script:{script}", "refund")
    try:
        approve, _ = shown_commands(child)
        assert " approve ask-acme-u1-" in approve
        elsewhere = plain_shell(cli_env, approve)
        assert elsewhere.returncode == 0, elsewhere.stderr
        child.expect(r"was approved elsewhere")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    # What the terminal shows at the end: the prompt and what ended it are still there, above the answer
    # (the live view is drawn afresh below them, never over them).
    screen = screen_of(child.logfile_read.getvalue())
    prompt = line_with(screen, "Approve this exact operation? [y/N]")
    said = line_with(screen, "was approved elsewhere")
    assert line_with(screen, "  approve:   ") < prompt < said < screen.index("Done.")
    operation_id = approve.split()[-5]
    assert len(admin_effects(cli_env, operation_id)) == 1
    assert "Traceback" not in (child.before or "")


def test_the_prompt_ends_at_once_when_the_approval_expires(cli_env: dict[str, str], tmp_path: Path) -> None:
    script = refund_script(tmp_path / "r.json", {"orderId": "A110", "amountCents": 111, "reason": "slow"}, "OK.")
    child = spawn_ask(cli_env, "--user", "u1", "--approval-ttl-seconds", "2", "--model", f"script:{script}", "r")
    try:
        approve, _ = shown_commands(child)
        child.expect(r"was not approved in time \(expired\); nothing was sent")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 4  # answered, but the write was not done
    screen = screen_of(child.logfile_read.getvalue())
    said = line_with(screen, f"{approve.split()[-5]} was not approved in time (expired); nothing was sent")
    assert line_with(screen, "Approve this exact operation? [y/N]") < said < screen.index("OK.")
    assert admin_effects(cli_env, approve.split()[-5]) == []


def test_ctrl_c_at_the_prompt_leaves_the_request_waiting_and_says_how_to_decide(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    script = refund_script(tmp_path / "r.json", {"orderId": "A111", "amountCents": 112, "reason": "later"}, "OK.")
    child = spawn_ask(cli_env, "--user", "u1", "--model", f"script:{script}", "refund")
    try:
        approve, reject = shown_commands(child)
        child.sendintr()
        child.expect(r"interrupted: request (\S+) keeps running in the background[^\r\n]*\r\n")
        line = child.match.group(0)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130
    assert approve in line and reject in line
    workflow_id, operation_id = approve.split()[-6:-4]
    [op] = ledger_of(cli_env, workflow_id)
    assert op["state"] == "awaiting_approval"  # still waiting, nothing decided by the interrupt

    rejected = plain_shell(cli_env, reject)
    assert rejected.returncode == 0, rejected.stderr
    [op] = ledger_of(cli_env, workflow_id)
    assert op["state"] == "denied" and op["approval"]["by"] == "u1 via cli"
    assert admin_effects(cli_env, operation_id) == []
    # The result command it printed works as printed: the receipt, and ask's exit code (answered, not done).
    found = re.search(r"get its result with `([^`]+)`", line)
    assert found is not None, line
    got = plain_shell(cli_env, found[1])
    assert got.returncode == 4, got.stderr
    assert "OK." in got.stdout and operation_id in got.stderr


def test_ctrl_c_while_queued_in_a_thread_prints_a_command_that_follows_the_message_again(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    refund = refund_script(tmp_path / "r.json", {"orderId": "A111", "amountCents": 113, "reason": "queue"}, "Refunded.")
    first = spawn_ask(cli_env, "--user", "u1", "--thread", thread, "--model", f"script:{refund}", "refund")
    try:
        approve, _ = shown_commands(first)
        first.sendintr()  # message 1 keeps waiting for its approval
        first.expect(pexpect.EOF)
    finally:
        first.close(force=True)
    answer = tmp_path / "a.json"
    answer.write_text(json.dumps({"turns": [[{"type": "message", "content": "The refund is in."}]]}))
    # Named relative to where `ask` runs: the printed command runs from another directory all the same.
    relative = os.path.join("tests", os.path.relpath(answer, REPO_ROOT / "tests"))
    second = spawn_ask(cli_env, "--user", "u1", "--thread", thread, "--model", f"script:{relative}", "and then?")
    try:
        second.expect(r"queued: 1 earlier message")
        second.sendintr()
        second.expect(r"follow it again with `([^`]+)`")
        resume = second.match.group(1)
        second.expect(pexpect.EOF)
    finally:
        second.close(force=True)
    assert second.exitstatus == 130
    assert plain_shell(cli_env, approve).returncode == 0
    # The printed command, from a plain shell: the same message (attached, not asked again), its answer.
    followed = plain_shell(cli_env, resume)
    assert followed.returncode == 0, followed.stderr
    assert "The refund is in." in followed.stdout and f"thread {thread}, message 2" in followed.stderr


@pytest.mark.parametrize(
    ("order", "typed", "said", "state", "code"),
    [("A113", "y", "approved", "verified", 0), ("A114", "n", "rejected", "denied", 4)],
)
def test_the_answer_typed_at_the_prompt_is_signed_for_the_sessions_user_via_the_cli(
    cli_env: dict[str, str], tmp_path: Path, order: str, typed: str, said: str, state: str, code: int
) -> None:
    refund = {"orderId": order, "amountCents": 114, "reason": f"typed {typed}", "toAccount": None}
    script = refund_script(tmp_path / "r.json", refund, "Answered.")
    child = spawn_ask(cli_env, "--user", "u1", "--model", f"script:{script}", "refund")
    try:
        approve, _ = shown_commands(child)
        child.sendline(typed)
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == code, child.before
    screen = screen_of(child.logfile_read.getvalue())
    # Shown whole, then asked, then what was decided here, then the answer.
    shown = line_with(screen, f"  arguments: {json.dumps(refund, sort_keys=True)}")
    prompt = line_with(screen, "Approve this exact operation? [y/N]")
    decided = [index for index, line in enumerate(screen) if line.strip() == said]
    assert decided and shown < prompt < decided[0] < screen.index("Answered."), "\n".join(screen)
    workflow_id, operation_id = approve.split()[-6:-4]
    [op] = ledger_of(cli_env, workflow_id)
    # The decision is the session's user's, recorded as sent by the CLI's approval channel.
    assert (op["operation_id"], op["state"]) == (operation_id, state)
    assert (op["approval"]["by"], op["approval"]["decision"]) == ("u1 via cli", said)
    assert len(admin_effects(cli_env, operation_id)) == (1 if typed == "y" else 0)


def test_cancel_from_another_shell_stops_the_request_and_prints_its_receipt(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    refund = {"orderId": "A102", "amountCents": 120, "reason": "cancelled before approval", "toAccount": None}
    with refund_waiting_for_approval(cli_env, tmp_path, refund) as (ask, workflow_id, operation_id):
        # Only the request's own user cancels it; for anyone else it does not exist.
        foreign = run_cli(cli_env, "cancel", workflow_id, "--user", "u2")
        missing = run_cli(cli_env, "cancel", "ask-acme-u1-nope-0", "--user", "u2")
        assert foreign.returncode == missing.returncode == 2
        assert foreign.stderr.replace(workflow_id, "X") == missing.stderr.replace("ask-acme-u1-nope-0", "X")

        cancelled = run_cli(cli_env, "cancel", workflow_id, "--user", "u1")
        # Stopped (exit 1): nothing was sent, the receipt says so.
        assert cancelled.returncode == 1, cancelled.stderr
        assert "stop cancelled" in cancelled.stderr and operation_id in cancelled.stderr
        stdout, _ = ask.communicate(timeout=120)
    result = json.loads(stdout)
    [op] = result["operations"]
    assert (result["stop_reason"], op["operation_id"], op["state"]) == ("cancelled", operation_id, "expired")
    assert admin_effects(cli_env, operation_id) == []


def test_result_of_a_request_terminated_before_approval_exits_1_and_says_not_sent(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    refund = {"orderId": "A102", "amountCents": 130, "reason": "terminated by an operator", "toAccount": None}
    with refund_waiting_for_approval(cli_env, tmp_path, refund) as (ask, workflow_id, _):
        address = f"127.0.0.1:{cli_env['TOOLLOOP_TEMPORAL_PORT']}"
        terminate = [temporal_binary(), "workflow", "terminate", "--address", address, "--workflow-id", workflow_id]
        subprocess.run([*terminate, "--reason", "operator"], check=True, timeout=60, capture_output=True)
        ask.communicate(timeout=120)
        result = run_cli(cli_env, "result", workflow_id, "--user", "u1")
        cancel = run_cli(cli_env, "cancel", workflow_id, "--user", "u1")
    # It sent nothing (the refund waited for approval): failed, exit 1, and its receipt says the refund was not made.
    for done in (result, cancel):
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert lines[0] == "The workflow failed: terminated (operator)", lines
        assert "awaiting" not in done.stderr.lower() and "not sent" in done.stderr, done.stderr


def test_result_of_a_request_terminated_while_its_write_was_on_the_wire_exits_3_with_the_write_unknown(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    # Before, `result` exited 1 ("failed") without reading the ledger, and `--json` printed nothing, while `ask`
    # of the same run exited 3.
    assert run_cli(cli_env, "up").returncode == 0
    request_id = f"wire-{uuid.uuid4().hex[:8]}"
    workflow_id = request_workflow_id("acme", "u1", request_id)
    script = refund_script(tmp_path / "refund.json", {"orderId": "A104", "amountCents": 100, "reason": "damaged"})
    held = {"method": "POST", "path_regex": "^/orders/A104/refunds$", "latency_ms": 15000, "times": 1}
    with service_admin(cli_env) as admin:
        admin.put("/admin/faults", json={"rules": [held]}).raise_for_status()
        ask = ask_process(
            cli_env, "--auto-approve", "--request-id", request_id, "--model", f"script:{script}", "refund"
        )
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                answered = admin.get("/admin/requests", params={"path_prefix": "/orders/A104/refunds"})
                answered.raise_for_status()
                if any(r["method"] == "POST" and r["ended_at"] is None for r in answered.json()["requests"]):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the refund's POST never reached the service")
            address = f"127.0.0.1:{cli_env['TOOLLOOP_TEMPORAL_PORT']}"
            terminate = [temporal_binary(), "workflow", "terminate", "--address", address, "--workflow-id", workflow_id]
            subprocess.run([*terminate, "--reason", "operator"], check=True, timeout=60, capture_output=True)
            asked = ask.communicate(timeout=120)
        finally:
            if ask.poll() is None:
                ask.kill()
                ask.wait()
            admin.delete("/admin/faults").raise_for_status()
    text = run_cli(cli_env, "result", workflow_id, "--user", "u1")
    as_json = run_cli(cli_env, "result", workflow_id, "--user", "u1", "--json")
    assert ask.returncode == 3, asked[1]
    assert text.returncode == 3 and "Traceback" not in text.stderr, text.stderr
    assert text.stderr.startswith("The workflow failed: terminated (operator)")
    assert "UNKNOWN whether it happened" in text.stderr, text.stderr
    assert as_json.returncode == 3, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert shown["outcome"] == "unknown" and shown["status"] == "failed"
    [op] = shown["operations"]
    assert op["state"] == "unknown" and op["attempts"] == 1
    # `ask` printed the same, and the POST did reach the service.
    assert json.loads(asked[0])["operations"] == shown["operations"]


def test_ask_against_a_namespace_without_toolloops_search_attributes_says_how_to_register_them(
    temporal_server: TemporalServer,
) -> None:
    namespace = f"bare-{uuid.uuid4().hex[:8]}"
    temporal = [temporal_binary(), "--address", temporal_server.address]
    subprocess.run([*temporal, "operator", "namespace", "create", "--namespace", namespace], check=True, timeout=60)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_"))},
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TEMPORAL_NAMESPACE": namespace,
    }
    command = ["ask", "--user", "u1", "--no-local-stack", "Where is my order A100?"]
    deadline = time.monotonic() + 60
    done = run_cli(env, *command, timeout=60)
    while "has no toolloop search attributes" not in done.stderr and time.monotonic() < deadline:
        done = run_cli(env, *command, timeout=60)  # a new namespace takes a moment to be served
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr
    printed = line.partition("register them once with: ")[2]
    assert printed.startswith(f"{temporal_binary()} operator search-attribute create"), line
    # The command works as printed from a plain shell (the venv's bin not on PATH), and then the namespace has them.
    plain = {"PATH": "/usr/bin:/bin"}
    registered = subprocess.run(printed, shell=True, env=plain, cwd="/", capture_output=True, text=True, timeout=60)
    assert registered.returncode == 0, registered.stderr
    listed = subprocess.run(
        [*temporal, "operator", "search-attribute", "list", "--namespace", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for name in ("ToolloopUser", "ToolloopTenant", "ToolloopOutcome", "ToolloopUnsettled"):
        assert name in listed.stdout


STREAMED_ANSWER = "Your order A100 left the warehouse on Monday and should arrive on Thursday."


@pytest.fixture
def live_cli_env(
    tmp_path_factory: pytest.TempPathFactory, live_text_url: str
) -> Iterator[tuple[dict[str, str], FakeOpenAIServer]]:
    """A stack of its own whose worker's model streams (a loopback OpenAI server) into a live text store."""
    with FakeOpenAIServer() as model_server:
        env = stack_env(
            tmp_path_factory.mktemp("cli-live-stack"),
            TOOLLOOP_LIVE_TEXT_URL=live_text_url,
            OPENAI_API_KEY="sk-test-cli-live-0123456789",
            OPENAI_BASE_URL=model_server.url,
        )
        try:
            yield env, model_server
        finally:
            run_cli(env, "down", timeout=60)


def test_ask_shows_the_answer_as_it_is_written_then_prints_it_once(
    live_cli_env: tuple[dict[str, str], FakeOpenAIServer],
) -> None:
    env, model_server = live_cli_env
    # created, the message added, then 4 pieces of 4 characters: the rest waits until the test saw them.
    model_server.reply(responses_response(output_message(STREAMED_ANSWER)), fault="pause", fault_after=6)
    child = spawn_ask(env, "--user", "u1", "--model", "openai", "Where is my order A100?")
    try:
        child.expect("Your order A100", timeout=120)
        assert "Thursday" not in child.logfile_read.getvalue()  # written so far, not yet the whole answer
        model_server.resume()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    screen = screen_of(child.logfile_read.getvalue())
    # The live view is gone; the answer is on the screen once.
    assert sum(line.count(STREAMED_ANSWER) for line in screen) == 1, "\n".join(screen)
    assert not any("writing" in line for line in screen)


# --- approval policies on the local stack (`up --policy`) ----------------------------------------------------


@pytest.fixture(scope="module")
def policy_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local stack of its own that decides writes by the demo policy, in a namespace and on a task queue of its
    own: a command it prints must name them (a printed `approve` went to the default namespace and found nothing)."""
    env = stack_env(
        tmp_path_factory.mktemp("cli-policy-stack"), TEMPORAL_NAMESPACE="team-one", TOOLLOOP_TASK_QUEUE="team-one-q"
    )
    up = run_cli(env, "up", "--policy")
    assert up.returncode == 0, up.stderr
    yield env
    run_cli(env, "down", timeout=60)


def test_a_manager_finds_and_approves_a_refund_the_policy_leaves_to_managers(policy_env: dict[str, str]) -> None:
    status = run_cli(policy_env, "status")
    assert re.search(r"^policy worker: running \(pid \d+, task queue 'toolloop-policy'\)", status.stdout, re.M)
    assert "approval policy: on (" in status.stdout and "demo.cedar" in status.stdout
    # The offline model asks 4000 cents: over 10.00, which the demo policy leaves to a manager of the tenant.
    ask = ask_process(policy_env, "Refund 40.00 EUR on order A100 because it arrived late")
    try:
        assert ask.stderr is not None
        # The requester is told it waits for others, and is offered no command to decide it.
        seen = []
        for line in ask.stderr:
            seen.append(line)
            if "asked by rule" in line:
                break
        shown = "".join(seen)
        assert "waits for others" in shown and "manager-decides-larger-refunds: a manager" in shown, shown
        assert " approve " not in shown
        [workflow_id] = re.findall(r"in request (\S+)", shown)
        [operation_id] = re.findall(r"operation: (op_\w+)", shown)

        listed = run_cli(policy_env, "approvals", "--user", "m1", "--tenant", "acme")
        assert listed.returncode == 0, listed.stderr
        assert f"request {workflow_id} (requested by u1)" in listed.stdout
        assert f"operation: {operation_id}" in listed.stdout and "tool:      refund_order" in listed.stdout
        assert "rules:     manager-decides-larger-refunds (it waits for a manager)" in listed.stdout
        [approve] = re.findall(r"^  approve:\s+(.+)$", listed.stdout, re.M)
        assert f" approve {workflow_id} {operation_id} --user m1 --tenant acme" in approve

        # Another user of the tenant, and the manager of another tenant, are told what a missing request gets.
        assert run_cli(policy_env, "approvals", "--user", "u2").stdout.startswith("nothing waits for a decision")
        for who in (["--user", "u2"], ["--user", "m1", "--tenant", "globex"]):
            theirs = run_cli(policy_env, "approve", workflow_id, operation_id, *who)
            missing = run_cli(policy_env, "approve", "ask-acme-u1-nope-0", operation_id, *who)
            assert theirs.returncode == missing.returncode == 2
            assert theirs.stderr.replace(workflow_id, "X") == missing.stderr.replace("ask-acme-u1-nope-0", "X")
            assert "refund_order" not in theirs.stderr
        # The requester may not decide it either: one line, nothing signed.
        own = run_cli(policy_env, "approve", workflow_id, operation_id, "--user", "u1")
        assert own.returncode == 1 and own.stderr.strip() == (
            f"error: operation {operation_id}: u1 may not decide it "
            "(asked by rule manager-decides-larger-refunds: a manager)"
        )
        assert admin_effects(policy_env, operation_id) == []

        # The manager's command, run as printed from a plain shell.
        approved = plain_shell(policy_env, approve)
        assert approved.returncode == 0, approved.stderr
        assert f"{operation_id} is now approved" in approved.stderr
        stdout, _ = ask.communicate(timeout=120)
    finally:
        if ask.poll() is None:
            ask.kill()
            ask.wait()

    assert ask.returncode == 0
    [op] = json.loads(stdout)["operations"]
    assert (op["state"], op["approval"]["by"], op["policy"]["approved_by"]) == ("verified", "m1 via cli", ["m1"])
    assert len(admin_effects(policy_env, operation_id)) == 1
    # The receipt names the manager, the rule and the policy's version.
    receipt = run_cli(policy_env, "result", workflow_id, "--user", "u1")
    assert receipt.returncode == 0, receipt.stderr
    version = op["policy"]["version"].split(":")[1][:12]
    assert (
        f"policy: approved by m1 under rule manager-decides-larger-refunds; version sha256:{version}" in receipt.stderr
    )
    assert run_cli(policy_env, "approvals", "--user", "m1").stdout.startswith("nothing waits for a decision")


def test_down_stops_the_policy_worker_and_up_no_policy_turns_policies_off(policy_env: dict[str, str]) -> None:
    state = json.loads((Path(policy_env["TOOLLOOP_DATA_DIR"]) / "state.json").read_text())
    policy_pid = state["components"]["policy"]["pid"]
    assert state["policy"] is True and state["policy_key"]
    down = run_cli(policy_env, "down")
    assert down.returncode == 0, down.stderr
    assert f"stopped policy worker (pid {policy_pid}, task queue 'toolloop-policy')" in down.stdout
    assert not pid_alive(policy_pid)

    up = run_cli(policy_env, "up", "--no-policy")
    assert up.returncode == 0, up.stderr
    assert "policy worker" not in up.stdout
    assert "approval policy: off; turn it on with: " in up.stdout and up.stdout.rstrip().endswith(" up --policy")
    # Without a policy the requester decides their own refund (and nobody else may): as before.
    done = run_cli(policy_env, "ask", "--user", "u1", "--json", "--auto-approve", "Refund 30.00 EUR on order A100")
    assert done.returncode == 0, done.stderr
    [op] = json.loads(done.stdout)["operations"]
    assert (op["state"], op["approval"]["by"], op["policy"]) == ("verified", "u1 via cli", None)


def test_a_request_that_ended_without_a_report_and_whose_writes_cannot_be_read_is_unknown_never_no_writes(
    temporal_server: TemporalServer,
) -> None:
    # Started on a task queue no worker serves, then terminated: nobody can replay it to read its ledger now.
    # Before, the CLI took that as "no writes" (`"operations": []`, exit 1, or for `result` exit 1 unread).
    queue = f"nobody-{uuid.uuid4().hex[:8]}"
    request_id = f"unread-{uuid.uuid4().hex[:8]}"

    async def start_and_terminate() -> str:
        temporal = await Client.connect(temporal_server.address, data_converter=data_converter())
        tl = toolloop.ToolloopClient(temporal, task_queue=queue, channel="test")
        request = await tl.start(
            "refund order A100", actor=toolloop.Actor(user_id="u1", tenant_id="acme"), request_id=request_id
        )
        await request.handle.terminate(reason="operator")
        return request.workflow_id

    workflow_id = run_coroutine_blocking(start_and_terminate)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_"))},
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_TASK_QUEUE": queue,
    }
    command = ["result", workflow_id, "--user", "u1", "--no-local-stack"]
    text = run_cli(env, *command, timeout=120)
    as_json = run_cli(env, *command, "--json", timeout=120)
    assert text.returncode == 3 and "Traceback" not in text.stderr, text.stderr
    assert text.stderr.startswith("The workflow failed: terminated (operator)")
    assert "Its writes could not be read now: treat them as unknown until they are." in text.stderr
    assert as_json.returncode == 3, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert (shown["outcome"], shown["operations"]) == ("unknown", None)


def test_deciding_on_another_persons_request_that_cannot_be_asked_looks_like_a_missing_request(
    temporal_server: TemporalServer,
) -> None:
    # u1's request on a queue no worker serves: for u2 (same tenant) `approve` said nothing for a long while and
    # then failed as Temporal's error, telling u2 that the request exists; a missing id is one line, exit 2.
    queue = f"nobody-{uuid.uuid4().hex[:8]}"

    async def start() -> str:
        temporal = await Client.connect(temporal_server.address, data_converter=data_converter())
        tl = toolloop.ToolloopClient(temporal, task_queue=queue, channel="test")
        request = await tl.start("refund order A100", actor=toolloop.Actor(user_id="u1", tenant_id="acme"))
        return request.workflow_id

    workflow_id = run_coroutine_blocking(start)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TOOLLOOP_", "TEMPORAL_"))},
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TOOLLOOP_TASK_QUEUE": queue,
        "TOOLLOOP_APPROVAL_KEY": APPROVAL_KEY,
    }
    operation = "op_" + "0" * 32
    missing_id = f"ask-acme-u1-none-{uuid.uuid4().hex[:12]}"
    theirs = run_cli(env, "approve", workflow_id, operation, "--user", "u2", "--no-local-stack", timeout=120)
    missing = run_cli(env, "approve", missing_id, operation, "--user", "u2", "--no-local-stack", timeout=120)
    assert (theirs.returncode, missing.returncode) == (2, 2), (theirs.stderr, missing.stderr)
    assert theirs.stderr.replace(workflow_id, "WF") == missing.stderr.replace(missing_id, "WF")
    assert len(theirs.stderr.strip().splitlines()) == 1
