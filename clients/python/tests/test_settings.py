"""`session.set_settings(...)`, `session.settings()` and `client.kernels(labels=...)` against a
real `kernelbox serve` whose tenants file gives tenant `rich` its own session limits and
`plain` none (docs/http-api.md, "Session settings")."""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterator

import pytest

from conftest import Server, kernelbox_serve, stop_and_check
from kernelbox_client import AsyncClient, BadRequest, Client, SessionSettings, SettingsApplied

ENV = "import os; print(os.environ.get('REGION'))"


@pytest.fixture(scope="module")
def settings_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tenants = {
        "rich": {"max_kernels": 3, "session_limits": {"memory": "1g", "idle_timeout": "2h"}},
        "plain": {"max_kernels": 2},
    }
    case = f"pyclient-settings-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(
        tmp_path_factory.mktemp("settings"), case, tenants, "--pool", "0"
    )
    yield s
    stop_and_check(s)


def test_settings_reach_the_kernel_and_labels_filter_the_kernels(settings_server: Server) -> None:
    with Client(settings_server.url, settings_server.token("rich")) as c:
        s = c.session("analysis")
        applied = s.set_settings(
            env={"REGION": "eu"}, memory="768m", idle_timeout=3600, labels={"team": "data"}
        )
        assert isinstance(applied, SettingsApplied)
        assert applied.restart_required is False
        assert applied.settings.memory == 768 * 1024 * 1024
        assert s.run(ENV).output == "eu\n"
        assert c.session("other").run(ENV).output == "None\n"
        assert s.settings() == SessionSettings(
            env={"REGION": "eu"},
            memory=768 * 1024 * 1024,
            idle_timeout=3600.0,
            labels={"team": "data"},
        )
        labelled = c.kernels(labels={"team": "data"})
        assert [k.session for k in labelled] == ["analysis"]
        assert labelled[0].labels == {"team": "data"}
        assert c.kernels(labels={"team": "ops"}) == []
        assert {k.session for k in c.kernels()} == {"analysis", "other"}
        again = s.set_settings(env={"REGION": "us"}, memory="768m", labels={"team": "data"})
        assert again.restart_required is True
        assert s.run(ENV, reset=True).output == "us\n"
        with pytest.raises(BadRequest) as e:
            s.set_settings(memory="2g")
        assert e.value.code == "settings_not_allowed"


def test_a_tenant_without_limits_may_only_lower_the_defaults(settings_server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(settings_server.url, settings_server.token("plain")) as c:
            s = c.session("analysis")
            with pytest.raises(BadRequest) as e:
                await s.set_settings(idle_timeout=7 * 24 * 3600)
            assert e.value.code == "settings_not_allowed"
            applied = await s.set_settings(idle_timeout=60, env={"REGION": "ap"})
            assert applied.settings.idle_timeout == 60.0
            assert (await s.run(ENV)).output == "ap\n"
            # Another tenant's session of the same name is not this one.
            assert (await s.settings()).env == {"REGION": "ap"}

    asyncio.run(main())
    with Client(settings_server.url, settings_server.token("rich")) as c:
        assert c.session("analysis").settings().env != {"REGION": "ap"}
