"""`kinv mcp` driven by the MCP SDK's own client over stdio, as a coding agent would: list the tools, start a
replay run of #3a with approval ask, see it wait in pending, be refused approve (not exposed), have a person
approve in the CLI, resume through MCP, read the close-out resource; bad arguments are tool errors and the
server keeps going; what the tools return is what the CLI's --json prints."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.utils import kinv_in_process, replay_env, run_kinv

pytest.importorskip("mcp")

ROOT = Path(__file__).resolve().parents[3]


def _project(tmp_path) -> Path:
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "plans", proj / "plans", ignore=shutil.ignore_patterns("closeouts", "campaigns"))
    return proj


async def _with_session(env, cwd, fn, *extra):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "kinv.agent.cli.app", "mcp", *extra], env=env,
                                   cwd=str(cwd))  # fmt: skip
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await fn(session)


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


async def _until(fn, what: str, timeout: float = 240):
    t0 = time.time()
    while time.time() - t0 < timeout:
        got = await fn()
        if got:
            return got
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_what_the_tools_and_resources_read_of_a_closed_run_is_what_the_cli_prints(tmp_path, state_dir, closed_3a):
    env = replay_env(tmp_path, state_dir)
    proj = _project(tmp_path)

    async def flow(s):
        res = await s.read_resource("kinv://closeout/3a")
        assert "# Close-out #3a" in res.contents[0].text
        png = await s.read_resource("kinv://closeout/3a/png")
        assert png.contents[0].mimeType == "image/png" and len(png.contents[0].blob) > 1000
        plan = await s.read_resource("kinv://plan/3a-attention-occupancy")
        assert "workstream:" in plan.contents[0].text
        for tool, args, cli in (("status", {}, ["status"]), ("experiments", {"ws": "3a"}, ["experiments", "3a"]),
                                ("todos", {"ws": "3a", "format": "claude"}, ["todos", "3a", "--format", "claude"]),
                                ("todos", {"ws": "3a"}, ["todos", "3a"]), ("pending", {}, ["pending"]),
                                ("history", {"ws": "3a"}, ["history", "3a"]), ("show", {"experiment": 3}, ["show", "3"])):
            got = (await s.call_tool(tool, args)).structuredContent
            want = json.loads(kinv_in_process(env, *cli, "--json", cwd=proj).stdout)
            assert got.get("result", got) == want, tool
        return True

    assert asyncio.run(_with_session(env, proj, flow))


@pytest.mark.slow
def test_an_agent_starts_watches_and_reads_an_investigation_but_a_person_approves(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    proj = _project(tmp_path)

    async def flow(s):
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert {"status", "todos", "experiments", "show", "history", "pending", "report", "kernels", "run",
                "resume", "campaign", "bench", "noise", "propose_plan"} <= set(tools)  # fmt: skip
        assert "approve" not in tools and "reject" not in tools
        assert tools["run"].inputSchema["properties"]["approval"]["enum"] == ["ask", "auto-config", "auto"]

        r = await s.call_tool("run", {"plan": "plans/3a-attention-occupancy.yaml", "backend": "replay",
                                      "approval": "ask"})  # fmt: skip
        assert not r.isError and r.structuredContent["workstream"] == "#3a"
        pid = r.structuredContent["pid"]
        decided = []
        while True:
            async def waiting():
                pr, sr = await s.call_tool("pending"), await s.call_tool("status")
                if pr.isError or sr.isError:  # the run has not created its state dir yet
                    return None
                p, st = pr.structuredContent["result"], sr.structuredContent
                closed = any(w["id"] == "#3a" and w["report_path"] for w in st["workstreams"])
                return p or closed

            got = await _until(waiting, "an approval or the close-out")
            if got is True:
                break
            aid = got[0]["id"]
            # the agent cannot approve its own kernel edit
            refused = await s.call_tool("approve", {"approval_id": aid})
            assert refused.isError
            await _until(lambda p=pid: asyncio.sleep(0, _gone(p)), "the paused run to exit")
            assert run_kinv(env, "approve", aid, cwd=proj).returncode == 0  # a person, in the CLI
            decided.append(aid)
            r = await s.call_tool("resume", {"ws": "3a", "backend": "replay"})
            assert not r.isError, r.content
            pid = r.structuredContent["pid"]
        assert len(decided) == 2  # V1 and V2 (V3 is moot)
        res = await s.read_resource("kinv://closeout/3a")
        assert "# Close-out #3a" in res.contents[0].text
        png = await s.read_resource("kinv://closeout/3a/png")
        assert png.contents[0].mimeType == "image/png" and len(png.contents[0].blob) > 1000
        plan = await s.read_resource("kinv://plan/3a-attention-occupancy")
        assert "workstream:" in plan.contents[0].text
        # what the tools return is what the CLI's --json prints
        await _until(lambda p=pid: asyncio.sleep(0, _gone(p)), "the run to exit")
        for tool, args, cli in (("status", {}, ["status"]), ("experiments", {"ws": "3a"}, ["experiments", "3a"]),
                                ("todos", {"ws": "3a", "format": "claude"}, ["todos", "3a", "--format", "claude"]),
                                ("todos", {"ws": "3a"}, ["todos", "3a"]), ("pending", {}, ["pending"]),
                                ("history", {"ws": "3a"}, ["history", "3a"])):
            got = (await s.call_tool(tool, args)).structuredContent
            want = json.loads(run_kinv(env, *cli, "--json", cwd=proj).stdout)
            assert got.get("result", got) == want, tool
        return True

    assert asyncio.run(_with_session(env, proj, flow))


def test_bad_arguments_are_one_tool_error_each_and_the_server_keeps_going(tmp_path):
    from kinv.agent.store.db import Store

    env = replay_env(tmp_path, tmp_path / "state")
    proj = _project(tmp_path)
    Store(tmp_path / "state", create=True).close()

    async def flow(s):
        bad = [
            ("run", {"plan": "/etc/passwd"}, "outside the project"),
            ("run", {"plan": "plans/nope.yaml"}, "not a YAML file in the project"),
            ("run", {"plan": "plans/3a-attention-occupancy.yaml", "approval": "yes"}, "approval"),
            ("todos", {"ws": "9z"}, "9z"),
            ("show", {"experiment": 99999}, "99999"),
            ("report", {"ws": "3a"}, "3a"),
            ("resume", {"ws": "3a"}, "3a"),
            ("bench", {"variant": "__import__('os')"}, "tunable=value"),
            ("propose_plan", {"name": "../evil", "text": "x: 1"}, "name"),
            ("propose_plan", {"name": "8a-broken", "text": "workstream: {id: '#8a'}"}, "plans/8a-broken.yaml"),
            ("campaign", {"plan": "plans/3a-attention-occupancy.yaml"}, "no campaign: section"),
        ]
        for tool, args, needle in bad:
            r = await s.call_tool(tool, args)
            assert r.isError, (tool, args)
            text = r.content[0].text
            assert needle in text and "Traceback" not in text, (tool, text)
        assert not (proj / "plans" / "8a-broken.yaml").exists() and not (tmp_path / "evil.yaml").exists()
        ok = await s.call_tool("status")
        assert not ok.isError
        # a long tool is awaited in a subprocess: the server answers other calls meanwhile
        bench = asyncio.create_task(s.call_tool("bench", {"backend": "replay", "samples": 2}))
        assert not (await s.call_tool("pending")).isError
        got = await bench
        assert not got.isError, got.content
        rows = got.structuredContent["result"]
        want = json.loads(run_kinv(env, "bench", "--backend", "replay", "--samples", "2", "--json", cwd=proj).stdout)
        assert [r["level"] for r in rows] == [r["level"] for r in want] and all(r["us"] > 0 for r in rows)
        return True

    assert asyncio.run(_with_session(env, proj, flow))


def test_a_proposed_plan_is_validated_stored_with_its_hash_and_runnable(tmp_path):
    env = replay_env(tmp_path, tmp_path / "state")
    proj = _project(tmp_path)
    text = (ROOT / "plans" / "3a-attention-occupancy.yaml").read_text().replace('id: "#3a"', 'id: "#8a"')

    async def flow(s):
        r = await s.call_tool("propose_plan", {"name": "8a-occupancy-again", "text": text})
        assert not r.isError, r.content
        assert r.structuredContent["workstream"] == "#8a" and r.structuredContent["variants"] == ["V1", "V2", "V3"]
        assert (proj / "plans" / "8a-occupancy-again.yaml").read_text() == text
        again = await s.call_tool("propose_plan", {"name": "8a-occupancy-again", "text": text + "\n# changed\n"})
        assert again.isError and "exists" in again.content[0].text
        return True

    assert asyncio.run(_with_session(env, proj, flow))


def test_approve_is_exposed_only_when_a_person_starts_the_server_so(tmp_path):
    from kinv.agent.store.db import Store

    env = replay_env(tmp_path, tmp_path / "state")
    proj = _project(tmp_path)
    Store(tmp_path / "state", create=True).close()

    async def flow(s):
        names = {t.name for t in (await s.list_tools()).tools}
        assert {"approve", "reject"} <= names
        r = await s.call_tool("approve", {"approval_id": "nope"})
        assert r.isError and "nope" in r.content[0].text
        return True

    assert asyncio.run(_with_session(env, proj, flow, "--allow-approve"))
    for client in ("claude", "opencode"):
        r = run_kinv(env, "mcp", "--print-config", client)
        assert r.returncode == 0 and "kinv" in json.loads(r.stdout)[("mcpServers" if client == "claude" else "mcp")]


def test_the_server_registers_every_tool_and_resource_and_approve_only_when_a_person_allows_it(tmp_path):
    """In process, no subprocess: each tool and resource is registered with the description an agent reads; approve
    and reject exist only with --allow-approve."""
    from kinv.agent.cli.mcp_server import build

    read = {"status", "todos", "experiments", "show", "history", "pending", "report", "kernels"}
    act = {"run", "resume", "campaign", "bench", "noise", "propose_plan"}

    async def listed(allow: bool):
        server = build(str(tmp_path / "state"), str(tmp_path), allow_approve=allow)
        tools = {t.name: t for t in await server.list_tools()}
        templates = {t.uriTemplate for t in await server.list_resource_templates()}
        return tools, templates

    tools, templates = asyncio.run(listed(False))
    assert set(tools) == read | act
    assert all(t.description and t.description.strip() for t in tools.values())
    assert tools["todos"].inputSchema["properties"]["format"]["enum"] == ["kinv", "opencode", "claude"]
    assert templates == {"kinv://closeout/{ws}", "kinv://closeout/{ws}/png", "kinv://plan/{name}"}
    tools, _ = asyncio.run(listed(True))
    assert set(tools) == read | act | {"approve", "reject"}
    assert "reason" in tools["reject"].inputSchema["properties"]
