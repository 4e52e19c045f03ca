"""API keys: every API route needs one; probes stay open unless closed; the openai SDK works;
the keys come from flags, a file and the environment and never reach the log."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app
from aioengine.server.__main__ import build_parser
from aioengine.server.auth import API_KEY_ENV, collect_keys
from tests.server.server_process import ServerProcess

KEYS = ("sk-first-0123456789", "sk-second-abcdef")
BODY = {"prompt": "hi", "max_tokens": 2}


async def _server(engine, **settings) -> TestServer:
    srv = TestServer(create_app(engine, ServerSettings(**settings)), host="127.0.0.1")
    await srv.start_server()
    return srv


@pytest.fixture
async def keyed(engine) -> AsyncIterator[TestServer]:
    srv = await _server(engine, api_keys=KEYS)
    try:
        yield srv
    finally:
        await srv.close()


@pytest.mark.parametrize(("headers", "fragment"), [
    ({}, "missing API key"), ({"Authorization": "Bearer sk-wrong"}, "incorrect API key"),
    ({"Authorization": f"Basic {KEYS[0]}"}, "missing API key"),
    ({"Authorization": "Bearer "}, "missing API key"),
    ({"Authorization": f"Bearer {KEYS[0]}x"}, "incorrect API key")],
    ids=["none", "wrong", "basic", "empty", "longer"])
async def test_requests_without_a_right_key_get_401(keyed, headers, fragment):
    async with aiohttp.ClientSession(headers=headers) as s:
        for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                             ("GET", "/v1/models"), ("GET", "/v1/models/tiny"),
                             ("GET", "/v1/nothing-here")):
            async with s.request(method, keyed.make_url(path), json=BODY) as resp:
                assert resp.status == 401, (path, await resp.text())
                assert resp.headers["WWW-Authenticate"] == "Bearer"
                err = (await resp.json())["error"]
                assert fragment in err["message"] and err["code"] == "invalid_api_key"
                assert KEYS[0] not in await resp.text()


async def test_any_configured_key_is_accepted_and_probes_stay_open(keyed):
    for key in KEYS:
        async with aiohttp.ClientSession(headers={"Authorization": f"bearer {key}"}) as s, \
                s.post(keyed.make_url("/v1/completions"), json=BODY) as resp:
            assert resp.status == 200, await resp.text()
    async with aiohttp.ClientSession() as s:
        for path in ("/health", "/metrics"):
            async with s.get(keyed.make_url(path)) as resp:
                assert resp.status == 200, path


async def test_probes_can_be_closed_too(engine):
    srv = await _server(engine, api_keys=KEYS, protect_health_and_metrics=True)
    try:
        async with aiohttp.ClientSession() as s:
            for path in ("/health", "/metrics"):
                async with s.get(srv.make_url(path)) as resp:
                    assert resp.status == 401, path
                async with s.get(srv.make_url(path),
                                 headers={"Authorization": f"Bearer {KEYS[1]}"}) as resp:
                    assert resp.status == 200, path
    finally:
        await srv.close()


async def test_openai_sdk_with_and_without_the_key(keyed):
    import openai

    base = str(keyed.make_url("/v1"))
    good = openai.AsyncOpenAI(base_url=base, api_key=KEYS[1], max_retries=0)
    bad = openai.AsyncOpenAI(base_url=base, api_key="sk-nope", max_retries=0)
    try:
        reply = await good.completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert reply.choices[0].text is not None
        with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
            await bad.completions.create(model="tiny", prompt="hi", max_tokens=2)
    finally:
        await good.close()
        await bad.close()


def test_settings_refuse_empty_keys_and_protection_without_keys():
    with pytest.raises(ValueError, match="api_keys must be non-empty strings"):
        ServerSettings(api_keys=("",))
    with pytest.raises(ValueError, match="protect_health_and_metrics needs api_keys"):
        ServerSettings(protect_health_and_metrics=True)


def test_keys_from_flags_file_and_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nsk-file-1\n\n  sk-file-2  \nsk-flag\n")
    monkeypatch.setenv(API_KEY_ENV, "sk-env")
    args = build_parser().parse_args(["--api-key", "sk-flag", "--api-key", "sk-flag-2",
                                      "--api-key-file", str(key_file)])
    assert collect_keys(args.api_key, args.api_key_file) == (
        "sk-flag", "sk-flag-2", "sk-file-1", "sk-file-2", "sk-env")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        collect_keys([], str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="cannot read the API key file"):
        collect_keys([], str(tmp_path / "missing"))


def test_a_real_server_with_a_key_file_never_logs_the_key(tmp_path):
    secret = "sk-real-server-7f3a9c"
    key_file = tmp_path / "keys"
    key_file.write_text(secret + "\n")
    with ServerProcess("--api-key-file", str(key_file), "--log-level", "DEBUG") as server:
        import urllib.error
        import urllib.request

        def post(key: str | None) -> int:
            req = urllib.request.Request(server.url + "/v1/completions", method="POST",
                                         data=b'{"prompt": "hi", "max_tokens": 2}',
                                         headers={"Content-Type": "application/json"})
            if key is not None:
                req.add_header("Authorization", f"Bearer {key}")
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code

        assert post(None) == 401 and post(secret + "x") == 401 and post(secret) == 200
        assert server.terminate() == 0
    assert not any(secret in line for line in server.log)
