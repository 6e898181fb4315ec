"""The operator's console in a real browser (docs/console.md): the pages render, their figures
are the API's, a tenant's view never shows another tenant, ending a session from the page ends
it, and an action without the admin token is refused. Every figure is compared with the
documented route it comes from, called here with the token itself."""

from __future__ import annotations

import time
from typing import Any, Dict, List

import httpx
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from conftest import BUSY, IDLE, LOST, REFUSED, REFUSED_HOST, Server, shot

WAIT = 30


def api(server: Server, token: str, path: str) -> Any:
    r = httpx.get(server.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def midnight() -> int:
    """Midnight UTC today, in seconds: the console's "today"."""
    return int(time.time()) // 86400 * 86400


def hour() -> int:
    """The current hour's start, in seconds: the chart's last bar."""
    return int(time.time()) // 3600 * 3600


def charted(driver: webdriver.Chrome) -> set:
    """The tenants the usage chart draws a figure for, once it has drawn."""
    WebDriverWait(driver, WAIT).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#charts figure, #charts p"))
    return {f.get_attribute("data-tenant")
            for f in driver.find_elements(By.CSS_SELECTOR, "#charts figure")}  # fmt: skip


def sign_in(driver: webdriver.Chrome, server: Server, token: str) -> None:
    driver.get(f"{server.url}/console?token={token}")
    WebDriverWait(driver, WAIT).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-rendered"))
    # The token left the address bar, and the page's script cannot read the cookie.
    assert driver.current_url == f"{server.url}/console", driver.current_url
    assert driver.execute_script("return document.cookie") == ""
    cookie = driver.get_cookie("kernelbox_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie


def rows(driver: webdriver.Chrome, table: str) -> List[List[str]]:
    out = []
    for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr"):
        out.append([td.text for td in tr.find_elements(By.TAG_NAME, "td")])
    return out


def fetch(driver: webdriver.Chrome, method: str, path: str, console_header: bool = True) -> int:
    """The status of a call made from the page, with its cookie (and the console's header)."""
    headers = {"x-kernelbox-console": "1"} if console_header else {}
    return int(driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[1], {method: arguments[0], headers: arguments[2], credentials: 'same-origin'})"
        ".then(r => done(r.status), e => done(-1));",
        method, path, headers))  # fmt: skip


def test_the_admin_view_renders_and_its_figures_are_the_apis(
    server: Server, admin_token: str, driver: webdriver.Chrome
) -> None:
    sign_in(driver, server, admin_token)
    assert "admin" in driver.find_element(By.ID, "who").text
    page = api(server, admin_token, "/v1/admin/kernels?limit=500")
    assert driver.find_element(By.ID, "kernel-count").text == f"({page['total']})"
    shown = {(r[0], r[1], r[2], r[3]) for r in rows(driver, "kernels")}
    assert shown == {(k["tenant"], k["session"], k["id"], k["state"]) for k in page["kernels"]}
    # Kernels in several states: idle ones, and the busy one.
    states = {(k["tenant"], k["session"]): k["state"] for k in page["kernels"]}
    assert states[BUSY] == "busy", states
    assert all(states[(t, s)] == "idle" for t, ss in IDLE.items() for s in ss), states
    tenants = api(server, admin_token, "/v1/admin/tenants")
    assert {r[0]: int(r[1]) for r in rows(driver, "tenants")} == {
        t["name"]: t["live_kernels"] for t in tenants["tenants"]}  # fmt: skip
    assert {r[0]: r[2] for r in rows(driver, "tenants")} == {"acme": "4", "globex": "3"}
    # Today's cells per tenant are the ledger's, read with the admin token.
    day = api(server, admin_token, f"/v1/usage?group_by=day&from={midnight()}")["rows"]
    assert {r["tenant"] for r in day} == {"acme", "globex"}, day
    assert {r[0]: int(r[7]) for r in rows(driver, "tenants")} == {r["tenant"]: r["cells"] for r in day}
    # The hourly chart: one figure per tenant with usage, 24 bars, each the ledger's cells of
    # that tenant and hour.
    hourly = api(server, admin_token, f"/v1/usage?group_by=hour&from={hour() - 23 * 3600}")
    assert hourly["group_by"] == "hour"
    assert charted(driver) == {r["tenant"] for r in hourly["rows"]} == {"acme", "globex"}
    for fig in driver.find_elements(By.CSS_SELECTOR, "#charts figure"):
        bars = fig.find_elements(By.CSS_SELECTOR, "rect.bar")
        assert len(bars) == 24
        ledger = {r["start"]: r["cells"] for r in hourly["rows"]
                  if r["tenant"] == fig.get_attribute("data-tenant") and r["cells"]}  # fmt: skip
        drawn = {int(b.get_attribute("data-hour")): int(b.get_attribute("data-value"))
                 for b in bars if b.get_attribute("data-value") != "0"}  # fmt: skip
        assert drawn == ledger and sum(drawn.values()) >= 2, (drawn, ledger)
    path = shot(driver, "admin")
    assert path.stat().st_size > 0


def test_a_tenants_view_never_shows_another_tenant(
    server: Server, driver: webdriver.Chrome
) -> None:
    sign_in(driver, server, server.token("globex"))
    assert driver.find_element(By.ID, "who").text == "tenant globex (read-only)"
    mine = api(server, server.token("globex"), "/v1/kernels")["kernels"]
    shown = rows(driver, "kernels")
    assert {r[1] for r in shown} == {k["session"] for k in mine} == set(IDLE["globex"])
    assert all(r[0] == "globex" for r in shown)
    source = driver.page_source
    for session in IDLE["acme"] + [BUSY[1]]:
        assert session not in source
    assert "acme" not in source
    # No admin section, no action.
    assert not driver.find_element(By.ID, "tenants-section").is_displayed()
    assert driver.find_elements(By.CSS_SELECTOR, "#kernels button.danger") == []
    assert not driver.find_element(By.ID, "reload").is_displayed()
    # Today's usage is the tenant's own ledger, per session.
    ledger = api(server, server.token("globex"), f"/v1/usage?from={midnight()}")["rows"]
    assert {r["session"] for r in ledger} == set(IDLE["globex"]) | {LOST[1]}, ledger
    WebDriverWait(driver, WAIT).until(lambda d: rows(d, "usage"))
    assert {r[0] for r in rows(driver, "usage")} == set(IDLE["globex"]) | {LOST[1]}
    # The hourly chart: its own tenant's only.
    assert charted(driver) == {"globex"}
    # What happened lately: its own sessions' events, audit records and refusals only.
    WebDriverWait(driver, WAIT).until(lambda d: rows(d, "events") and rows(d, "audit"))
    assert {r[0] for r in rows(driver, "events")} == {"globex"}
    assert {r[1] for r in rows(driver, "audit")} == {"globex"}
    assert rows(driver, "refusals") == []
    assert REFUSED_HOST not in driver.page_source
    shot(driver, "tenant")


def test_an_action_without_the_admin_token_is_refused(
    server: Server, admin_token: str, driver: webdriver.Chrome
) -> None:
    target = f"/v1/admin/tenants/acme/sessions/{IDLE['acme'][1]}"
    sign_in(driver, server, server.token("globex"))
    assert fetch(driver, "DELETE", target) == 401
    assert fetch(driver, "POST", "/v1/admin/reload") in (401, 404)
    assert fetch(driver, "GET", "/v1/admin/kernels") == 401
    # The admin's cookie without the console's header is no token at all (CSRF).
    driver.delete_all_cookies()
    sign_in(driver, server, admin_token)
    assert fetch(driver, "DELETE", target, console_header=False) == 401
    assert fetch(driver, "GET", "/v1/whoami", console_header=False) == 401
    assert fetch(driver, "GET", "/v1/whoami") == 200
    # Nothing was ended.
    sessions = {k["session"] for k in api(server, server.token("acme"), "/v1/kernels")["kernels"]}
    assert IDLE["acme"][1] in sessions
    # A refused token sets no cookie.
    r = httpx.get(f"{server.url}/console?token=not-a-token", timeout=30, follow_redirects=False)
    assert r.status_code == 401 and "set-cookie" not in r.headers


def test_ending_a_session_from_the_page_ends_it(
    server: Server, admin_token: str, driver: webdriver.Chrome
) -> None:
    tenant, session = "acme", IDLE["acme"][0]
    before = server.containers()
    sign_in(driver, server, admin_token)
    button = driver.find_element(
        By.CSS_SELECTOR, f'#kernels button.danger[data-tenant="{tenant}"][data-session="{session}"]')
    button.click()
    alert = WebDriverWait(driver, WAIT).until(ec.alert_is_present())
    assert session in alert.text
    alert.accept()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        sessions = {k["session"] for k in api(server, server.token(tenant), "/v1/kernels")["kernels"]}
        if session not in sessions:
            break
        time.sleep(0.2)
    assert session not in sessions
    # Its container is gone from the engine; the others stay.
    while len(server.containers()) != len(before) - 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    after = server.containers()
    assert len(after) == len(before) - 1 and set(after) < set(before), (before, after)
    # The page shows it gone on its next refresh.
    WebDriverWait(driver, WAIT).until(lambda d: all(r[1] != session for r in rows(d, "kernels")))


def test_the_page_is_locked_down_and_no_token_reaches_the_log(
    server: Server, admin_token: str
) -> None:
    r = httpx.get(f"{server.url}/console", timeout=30)
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
    assert r.headers["x-frame-options"] == "DENY"
    for asset in ("/console/app.js", "/console/app.css"):
        body = httpx.get(server.url + asset, timeout=30).text
        assert admin_token not in body
    log = "".join(server.log)
    # The access log has the console's requests (their route, never their query).
    assert "/console" in log
    for token in [admin_token, *server.tokens.values()]:
        assert token not in log


def shown_detail(driver: webdriver.Chrome, tenant: str, session: str) -> None:
    """Clicks the session in the recent sessions' table and waits for its events."""
    WebDriverWait(driver, WAIT).until(lambda d: d.find_elements(
        By.CSS_SELECTOR, f'#events button[data-tenant="{tenant}"][data-session="{session}"]'))
    driver.find_element(
        By.CSS_SELECTOR, f'#events button[data-tenant="{tenant}"][data-session="{session}"]').click()
    WebDriverWait(driver, WAIT).until(
        lambda d: d.find_element(By.ID, "detail-name").text == f"{tenant} / {session}")


def test_the_kernel_detail_shows_its_events_and_why_it_was_lost(
    server: Server, admin_token: str, driver: webdriver.Chrome
) -> None:
    tenant, session = LOST
    sign_in(driver, server, admin_token)
    # Its kernel is gone from the kernels, but the recent sessions name it and why.
    events = api(server, admin_token, f"/v1/admin/tenants/{tenant}/sessions/{session}/events")
    assert events["lost"] == "timeout" and events["ended"], events
    assert [e["event"] for e in events["events"]] == ["started", "lost"], events
    listed = {(r[0], r[1]): r for r in rows(driver, "events")}
    assert listed[(tenant, session)][4] == "timeout", listed
    shown_detail(driver, tenant, session)
    assert driver.find_element(By.ID, "detail-loss").text == "lost: timeout"
    detail = rows(driver, "detail")
    # Newest first, as the API's oldest-first list reversed.
    assert [(r[1], r[2], int(r[3])) for r in detail] == [
        (e["event"], e.get("reason", "—"), e["generation"]) for e in reversed(events["events"])]
    # A live kernel's detail, from its row in the kernels' table: started cold.
    live_tenant, live = "globex", IDLE["globex"][0]
    driver.find_element(
        By.CSS_SELECTOR, f'#kernels button.link[data-tenant="{live_tenant}"][data-session="{live}"]').click()
    WebDriverWait(driver, WAIT).until(
        lambda d: d.find_element(By.ID, "detail-name").text == f"{live_tenant} / {live}")
    assert [r[1] for r in rows(driver, "detail")][-1] == "started"
    assert driver.find_element(By.ID, "detail-loss").text == ""
    # The tenant reads its own session's events, not through the admin's route.
    own = api(server, server.token(tenant), f"/v1/sessions/{session}/events")
    assert own == events
    theirs = api(server, server.token("acme"), f"/v1/sessions/{session}/events")
    assert theirs["tenant"] == "acme" and theirs["events"] == []
    shown_detail(driver, tenant, session)
    shot(driver, "kernel-detail")
    # The whole page, as docs/console.png shows it.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1200, min(int(height) + 140, 3000))
    driver.execute_script("window.scrollTo(0, 0)")
    shot(driver, "console")


def test_the_audit_tail_and_egress_refusals_are_the_apis(
    server: Server, admin_token: str, driver: webdriver.Chrome
) -> None:
    sign_in(driver, server, admin_token)
    tail = api(server, admin_token, "/v1/audit?limit=20")["records"]
    assert {r["tenant"] for r in tail} == {"acme", "globex"}, tail
    WebDriverWait(driver, WAIT).until(lambda d: len(rows(d, "audit")) == len(tail))
    shown = rows(driver, "audit")
    # Newest first; the hash cut to its start, the code only where the tenant records it.
    newest = list(reversed(tail))
    assert [(r[1], r[2], r[4]) for r in shown] == [
        (a["tenant"], a["session"], a["status"]) for a in newest]
    for row, record in zip(shown, newest):
        assert record["code_sha256"].startswith(row[6].rstrip("…"))
        if record["tenant"] == "globex":
            assert "code" not in record and row[7] == "(not recorded)", (row, record)
        else:
            assert row[7] == record["code"].strip() or row[7] in record["code"], (row, record)
    refusals = api(server, admin_token, "/v1/egress/refusals")
    assert refusals["egress"] is True
    mine = [x for x in refusals["refusals"] if x["host"] == REFUSED_HOST]
    assert mine and all((x["tenant"], x["session"]) == REFUSED for x in mine), refusals
    WebDriverWait(driver, WAIT).until(lambda d: rows(d, "refusals"))
    assert [(r[1], r[2], r[3], r[4]) for r in rows(driver, "refusals")] == [
        (x["tenant"], x["session"], f"{x['host']}:{x['port']}", x["reason"])
        for x in refusals["refusals"][:20]]
    # A tenant reads its own refusals only.
    assert api(server, server.token("globex"), "/v1/egress/refusals")["refusals"] == []
    assert api(server, server.token("acme"), "/v1/egress/refusals")["refusals"] == refusals["refusals"]
    r = httpx.get(f"{server.url}/v1/egress/refusals?tenant=acme", timeout=30,
                  headers={"Authorization": f"Bearer {server.token('globex')}"})  # fmt: skip
    assert r.status_code == 403
    shot(driver, "lately")
