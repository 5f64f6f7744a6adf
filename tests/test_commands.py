"""The command envelope: signing and every way an agent refuses one, as a table of
pure checks (no clock, no sleeps)."""

from __future__ import annotations

import copy
import json

import pytest

from watchdog.contracts import commands as c

TOKEN = "s3cret-token"
NOW = 1_700_000_000.0


def cmd(type=c.DUMP_STACKS, **over):
    base = c.make(
        job="job",
        type=type,
        host="node-a",
        issued_wall=NOW,
        ttl_s=30.0,
        id="c-1",
        args={"ranks": [c.target(2, 4242, 111)]} if type != c.SIGNAL else {"signal": "SIGTERM"},
        target=c.target(2, 4242, 111) if type == c.SIGNAL else None,
    )
    base.update(over)
    return c.sign(base, TOKEN)


def resigned(d, token=TOKEN):
    return c.sign(d, token)


def tampered_args():
    d = cmd()
    d["args"]["ranks"][0]["rank"] = 3  # signature left as it was
    return d


CASES = [
    # name, command, verify kwargs, expected reason ("" = accepted)
    ("valid", lambda: cmd(), {}, ""),
    ("valid signal", lambda: cmd(c.SIGNAL), {}, ""),
    ("valid at expiry instant", lambda: cmd(), {"now_wall": NOW + 30.0}, ""),
    ("forged signature", lambda: {**cmd(), "sig": "00" * 32}, {}, c.BAD_SIGNATURE),
    ("signed with another token", lambda: resigned(cmd(), "other"), {}, c.BAD_SIGNATURE),
    ("tampered args", tampered_args, {}, c.BAD_SIGNATURE),
    ("tampered type", lambda: {**cmd(), "type": c.SNAPSHOT_SLOTS}, {}, c.BAD_SIGNATURE),
    ("tampered expiry", lambda: {**cmd(), "expires_wall": NOW + 300}, {}, c.BAD_SIGNATURE),
    ("unsigned", lambda: {**cmd(), "sig": ""}, {}, c.UNSIGNED),
    ("no sig field", lambda: {k: v for k, v in cmd().items() if k != "sig"}, {}, c.UNSIGNED),
    ("expired", lambda: cmd(), {"now_wall": NOW + 30.001}, c.EXPIRED),
    ("issued in the future", lambda: cmd(), {"now_wall": NOW - c.MAX_FUTURE_S - 1}, c.NOT_YET_VALID),
    ("replayed", lambda: cmd(), {"seen_ids": {"c-1"}}, c.REPLAYED),
    ("issued before the agent started", lambda: cmd(), {"not_before": NOW + 0.5}, c.REPLAYED),
    ("issued the instant the agent started", lambda: cmd(), {"not_before": NOW}, ""),
    ("foreign job", lambda: cmd(job="other-job"), {}, c.FOREIGN_JOB),
    ("wrong host", lambda: cmd(host="node-b"), {}, c.WRONG_HOST),
    ("unknown type", lambda: cmd("reboot"), {}, c.UNKNOWN_TYPE),
    ("not an object", lambda: ["dump_stacks"], {}, c.MALFORMED),
    ("missing id", lambda: resigned({k: v for k, v in cmd().items() if k != "id"}), {}, c.MALFORMED),
    ("NaN expiry", lambda: {**cmd(), "expires_wall": float("nan")}, {}, c.MALFORMED),
    ("lifetime over the cap", lambda: resigned({**cmd(), "expires_wall": NOW + c.MAX_TTL_S + 1}), {}, c.MALFORMED),
    ("no ranks", lambda: resigned({**cmd(), "args": {"ranks": []}}), {}, c.MALFORMED),
    ("rank not a target", lambda: resigned({**cmd(), "args": {"ranks": [2]}}), {}, c.MALFORMED),
    (
        "bool pid",
        lambda: resigned({**cmd(), "args": {"ranks": [{"rank": 0, "pid": True, "proc_start_us": 1}]}}),
        {},
        c.MALFORMED,
    ),
    ("NaN in args", lambda: {**cmd(), "args": {"ranks": [c.target(2, 4242, 111)], "x": float("nan")}}, {}, c.MALFORMED),
    ("not JSON at all", lambda: {**cmd(), "args": {"ranks": [c.target(2, 4242, 111)], "x": {1, 2}}}, {}, c.MALFORMED),
    ("signal without target", lambda: resigned({**cmd(c.SIGNAL), "target": None}), {}, c.MALFORMED),
    ("signal not allowed", lambda: resigned({**cmd(c.SIGNAL), "args": {"signal": "SIGSEGV"}}), {}, c.MALFORMED),
    # Without a token on the agent.
    ("no token: evidence from loopback", lambda: c.sign(cmd(), ""), {"token": "", "loopback": True}, ""),
    ("no token: evidence from afar", lambda: c.sign(cmd(), ""), {"token": "", "loopback": False}, c.NO_TOKEN),
    (
        "no token: signal even on loopback",
        lambda: c.sign(cmd(c.SIGNAL), ""),
        {"token": "", "loopback": True},
        c.NO_TOKEN,
    ),
]


@pytest.mark.parametrize("name,make_cmd,kw,want", CASES, ids=[x[0] for x in CASES])
def test_verify_table(name, make_cmd, kw, want):
    args = {"token": TOKEN, "job": "job", "host": "node-a", "now_wall": NOW + 1.0, "seen_ids": set(), **kw}
    ok, reason = c.verify(
        make_cmd(),
        args.pop("token"),
        args.pop("job"),
        args.pop("host"),
        args.pop("now_wall"),
        args.pop("seen_ids"),
        **args,
    )
    assert (ok, reason) == (want == "", want)
    assert reason in ("",) + c.REFUSALS


def test_signature_survives_a_json_round_trip_and_key_order():
    d = cmd()
    wire = json.loads(json.dumps(dict(reversed(list(d.items())))))
    assert c.verify(wire, TOKEN, "job", "node-a", NOW, set()) == (True, "")


def test_sign_does_not_mutate_and_is_deterministic():
    d = c.make(
        job="j",
        type=c.SNAPSHOT_SLOTS,
        host="h",
        args={"ranks": [c.target(0, 1, 2)]},
        issued_wall=NOW,
        ttl_s=5,
        id="c-x",
    )
    before = copy.deepcopy(d)
    assert c.sign(d, TOKEN) == c.sign(d, TOKEN) and d == before
    assert c.sign(d, "")["sig"] == ""


def test_identity_check():
    t = c.target(1, 4242, 1_000_000)
    assert c.identity_ok(t, 1_005_000, 20_000) == (True, "")
    ok, why = c.identity_ok(t, 9_000_000, 20_000)
    assert not ok and "another process" in why
    ok, why = c.identity_ok(t, None, 20_000)
    assert not ok and "gone" in why


def test_replay_cache_keeps_ids_until_expiry_and_stays_bounded():
    rc = c.ReplayCache(capacity=3)
    rc.add("a", NOW + 10, NOW)
    rc.add("b", NOW + 20, NOW)
    rc.add("c", NOW + 30, NOW)
    assert "a" in rc and len(rc) == 3
    rc.add("d", NOW + 40, NOW)  # full, nothing expired: the soonest to expire goes
    assert "a" not in rc and {"b", "c", "d"} <= {x for x in "abcd" if x in rc}
    rc.add("e", NOW + 50, NOW + 500)  # far later: the expired ones are pruned first
    assert len(rc) == 1 and "e" in rc


@pytest.mark.parametrize(
    "host,want",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("10.0.0.1", False),
        ("coord", False),
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(host, want):
    assert c.is_loopback(host) is want


def test_a_command_signed_with_the_bearer_token_or_the_bearer_credential_is_refused():
    """Whoever reads a report holds what the agent sent as bearer: neither that nor
    the token used as a raw HMAC key signs a command (jobtoken.signing_key)."""
    import hashlib
    import hmac

    from watchdog import jobtoken

    unsigned = {k: v for k, v in cmd(c.SIGNAL).items() if k != "sig"}
    for key in (TOKEN, jobtoken.bearer(TOKEN)):
        forged = {**unsigned, "sig": hmac.new(key.encode(), c.canonical(unsigned), hashlib.sha256).hexdigest()}
        assert c.verify(forged, TOKEN, "job", "node-a", NOW, set()) == (False, c.BAD_SIGNATURE), key
    assert c.verify(cmd(c.SIGNAL), TOKEN, "job", "node-a", NOW, set()) == (True, "")
    # The three are distinct, and the bearer credential does not reveal the token.
    assert len({TOKEN, jobtoken.bearer(TOKEN), jobtoken.signing_key(TOKEN).decode()}) == 3
    assert jobtoken.bearer("") == ""
