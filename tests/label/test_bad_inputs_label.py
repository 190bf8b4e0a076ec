"""Bad input to the labelling page and its host objects: 403 without the token, 4xx for bad requests,
ValueErrors for bad settings, and in every case nothing stored and nothing changed."""

from __future__ import annotations

import pytest

from tests.label.conftest import Asker, random_obs, wait_for_round

ROUTES = [("GET", "/"), ("GET", "/static/app.js"), ("GET", "/static/style.css"), ("GET", "/api/state"),
          ("GET", "/clip/0/0/0"), ("POST", "/api/label"), ("POST", "/api/undo"), ("GET", "/nowhere")]


@pytest.fixture
def open_round(teacher, api):
    """Round 0 of 3 pairs open, pair 0 answered 'left'; yields ``(api, log bytes, state)`` to compare against."""
    asker = Asker(teacher, 0, random_obs(3), [0.2, 0.7, 0.9])
    wait_for_round(api, 0)
    assert api.label(0, 0, "left")[0] == 200
    yield api, teacher.log.path.read_bytes(), api.state()
    for p in (1, 2):
        api.label(0, p, "skip")
    asker.result()


def _unchanged(api, log_bytes, state, teacher):
    assert teacher.log.path.read_bytes() == log_bytes
    assert api.state() == state


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("kind", ["none", "empty", "wrong", "one character off", "longer", "non-ascii"])
def test_every_route_needs_the_token(teacher, open_round, method, path, kind):
    api, log_bytes, state = open_round
    token = {"none": None, "empty": "", "wrong": "wrong-token-of-the-right-kind", "longer": api.token + "A",
             "one character off": api.token[:-1] + ("x" if api.token[-1] != "x" else "y"),
             "non-ascii": "ünïcødé"}[kind]
    body = {"round": 0, "pair": 1, "choice": "right"} if method == "POST" else None
    status, data = api.request(method, path, body, token=token)
    assert status == 403
    if method == "GET" and path == "/" and token:   # a reload with an outdated token: a page that says so
        assert b"address is out of date" in data and b"new URL printed in the terminal" in data
    else:
        assert "token" in data["error"] and data["code"] == "token"
        if token:
            assert "restarted" in data["error"]
    _unchanged(api, log_bytes, state, teacher)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1:1", "localhost.evil:{port}",
                                  "10.0.0.1:{port}", "127.0.0.1:{port}x", ""])
def test_a_foreign_host_is_refused_even_with_the_token(teacher, open_round, host):
    """DNS rebinding: a page of another site that re-resolves its name to 127.0.0.1 still sends its own name."""
    api, log_bytes, state = open_round
    for method, path in ROUTES:
        body = {"round": 0, "pair": 1, "choice": "right"} if method == "POST" else None
        status, data = api.request(method, path, body, headers={"Host": host.format(port=api.port)})
        assert status == 403 and data["code"] == "host", (method, path, data)
    _unchanged(api, log_bytes, state, teacher)
    for name in ("127.0.0.1", "localhost", "LOCALHOST"):   # the names the server answers to
        assert api.request("GET", "/api/state", headers={"Host": f"{name}:{api.port}"})[0] == 200


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Origin": "null"},
                                     {"Origin": "http://127.0.0.1:1"}, {"Origin": "https://127.0.0.1:{port}"},
                                     {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}])
def test_answers_from_another_origin_are_refused(teacher, open_round, headers):
    api, log_bytes, state = open_round
    hdrs = {k: v.format(port=api.port) for k, v in headers.items()}
    for path, body in (("/api/label", {"round": 0, "pair": 1, "choice": "right"}), ("/api/undo", {"round": 0, "pair": 0})):
        status, data = api.request("POST", path, body, headers=hdrs)
        assert status == 403 and data["code"] == "origin", data
    _unchanged(api, log_bytes, state, teacher)
    status, _ = api.request("POST", "/api/label", {"round": 0, "pair": 1, "choice": "right"},
                            headers={"Origin": f"http://127.0.0.1:{api.port}", "Sec-Fetch-Site": "same-origin"})
    assert status == 200   # the page's own answer


def test_the_token_is_accepted_in_a_header_too(teacher, open_round):
    api, _, _ = open_round
    status, data = api.request("GET", "/api/state", token=None, headers={"X-Label-Token": api.token})
    assert status == 200 and data["round"] == 0
    status, _ = api.request("GET", "/api/state", token=None, headers={"X-Label-Token": api.token + "x"})
    assert status == 403


def test_the_page_and_its_assets_are_served_with_the_token(teacher, open_round):
    api, _, _ = open_round
    status, html = api.request("GET", "/")
    assert status == 200 and b"Which clip is better?" in html
    assert f"static/app.js?token={api.token}".encode() in html and b"__TOKEN__" not in html
    status, js = api.request("GET", "/static/app.js")
    assert status == 200 and b"api/label" in js
    status, data = api.request("GET", "/static/secret.txt")
    assert status == 404 and "no static file" in data["error"]


@pytest.mark.parametrize(("body", "status", "match"), [
    (b"{not json", 400, "JSON object"),
    (b"\xff\xfe", 400, "JSON object"),
    (b"[0, 1, \"left\"]", 400, "JSON object"),
    (b"[" * 2000, 400, "not nested"),                             # never a RecursionError and a 500
    (b"[" * 2000 + b"]" * 2000, 400, "not nested"),
    (b'{"round": 0, "pair": {"a": {"b": {"c": {"d": 1}}}}, "choice": "left"}', 400, "not nested"),
    (b'{"round": 0, "pair": 1, "choice": "[[[[[[[["}', 422, "choice must be one of"),   # brackets in a string
    (b"1" * 4000, 400, "JSON object"),
    ({"round": 0, "pair": 1}, 400, r"missing \['choice'\]"),
    ({"round": 0, "pair": 1, "choice": "left", "extra": 1}, 400, r"unexpected \['extra'\]"),
    ({"round": 0, "pair": "1", "choice": "left"}, 400, "pair must be an integer"),
    ({"round": 0, "pair": 1.0, "choice": "left"}, 400, "pair must be an integer"),
    ({"round": 0, "pair": 1, "choice": 2}, 400, "choice must be a string"),
    ({"round": 0, "pair": 7, "choice": "left"}, 404, "no pair 7"),
    ({"round": 1, "pair": 1, "choice": "left"}, 409, "round 1 is not open"),
    ({"round": 0, "pair": 0, "choice": "right"}, 409, "already labelled"),
    ({"round": 0, "pair": 1, "choice": "LEFT"}, 422, "choice must be one of"),
    ({"round": 0, "pair": 1, "choice": "left", "pad": "x" * 5000}, 413, "4096-byte limit"),
    (iter([b'{"round": 0, "pair": 1, "choice": "left", "pad": "', b"x" * 3000, b"x" * 3000, b'"}']),
     413, "4096-byte limit"),                                     # chunked: no Content-Length to trust
])
def test_bad_labels_get_a_json_4xx_and_change_nothing(teacher, open_round, body, status, match):
    import re

    api, log_bytes, state = open_round
    got, data = api.request("POST", "/api/label", body)
    assert got == status and re.search(match, data["error"]), data
    assert data["status"] == status
    _unchanged(api, log_bytes, state, teacher)


def test_wrong_methods_and_unknown_clips_are_refused(teacher, open_round):
    api, log_bytes, state = open_round
    assert api.request("GET", "/api/label")[0] == 405
    assert api.request("DELETE", "/api/state")[0] == 405
    assert api.request("GET", "/clip/0/9/0")[0] == 404
    assert api.request("GET", "/clip/3/0/0")[0] == 404
    assert api.request("GET", "/clip/0/0/2")[0] == 404
    _unchanged(api, log_bytes, state, teacher)


def test_responses_keep_the_token_from_leaking(teacher, open_round):
    import http.client

    api, _, _ = open_round
    conn = http.client.HTTPConnection(api.host, api.port, timeout=10)
    try:
        conn.request("GET", f"/?token={api.token}")
        res = conn.getresponse()
        res.read()
        assert res.getheader("Referrer-Policy") == "no-referrer" and res.getheader("Cache-Control") == "no-store"
        assert "default-src 'self'" in res.getheader("Content-Security-Policy")
    finally:
        conn.close()


def test_settings_are_checked(web, tmp_path):
    from jaxweight.label import HumanTeacher
    from jaxweight.label.server import LabelServer

    log = tmp_path / "l.jsonl"
    for kwargs, match in [({"host": "0.0.0.0"}, "loopback"), ({"host": "192.168.1.2"}, "loopback"),
                          ({"host": "example.com"}, "loopback"), ({"port": 70000}, r"port must be an int"),
                          ({"port": -1}, r"port must be an int"), ({"token": "short"}, ">= 16 URL-safe"),
                          ({"token": "has spaces and more than 16"}, "URL-safe"), ({"max_body": 10}, "max_body"),
                          ({"poll_s": 0}, "poll_s")]:
        with pytest.raises(ValueError, match=match):
            HumanTeacher(log, "cartpole", announce=None, **kwargs)
    with pytest.raises(ValueError, match="no renderer for environment 'ant'"):
        HumanTeacher(log, "ant")
    with pytest.raises(ValueError, match="loopback"):
        LabelServer(None, host="::ffff:10.0.0.1")
    t = HumanTeacher(log, "cartpole", announce=None, host="127.0.0.1")
    with pytest.raises(ValueError, match=r"shape \(P, 2, T, D\)"):
        t.ask(0, random_obs(2)[:, 0])
    t.close()


def test_a_busy_port_is_an_os_error(teacher, tmp_path):
    from jaxweight.label import HumanTeacher

    other = HumanTeacher(tmp_path / "other.jsonl", "cartpole", announce=None, port=teacher.server.port)
    with pytest.raises(OSError):
        other.start()
    other.close()
