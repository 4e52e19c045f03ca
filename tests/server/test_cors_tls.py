"""CORS for browser apps on other origins (off by default) and HTTPS with a throwaway
self-signed certificate, through a real server process."""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from aioengine.server import ServerSettings, create_app
from aioengine.server.__main__ import tls_context
from tests.server.server_process import ServerProcess

APP = "https://app.example"
PREFLIGHT = {"Origin": APP, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type, authorization"}


async def _server(engine, **settings) -> TestServer:
    srv = TestServer(create_app(engine, ServerSettings(**settings)), host="127.0.0.1")
    await srv.start_server()
    return srv


async def test_cors_off_by_default(server):
    async with aiohttp.ClientSession() as s:
        async with s.options(server.make_url("/v1/chat/completions"), headers=PREFLIGHT) as r:
            assert "Access-Control-Allow-Origin" not in r.headers
        async with s.get(server.make_url("/v1/models"), headers={"Origin": APP}) as r:
            assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers


async def test_allowed_origin_gets_preflight_and_headers_even_with_keys(engine):
    srv = await _server(engine, allowed_origins=(APP,), api_keys=("sk-cors",))
    try:
        async with aiohttp.ClientSession() as s:
            url = srv.make_url("/v1/chat/completions")
            async with s.options(url, headers=PREFLIGHT) as r:  # browsers send no key here
                assert r.status == 200, await r.text()
                assert r.headers["Access-Control-Allow-Origin"] == APP
                assert "POST" in r.headers["Access-Control-Allow-Methods"]
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with s.post(url, json=body, headers={"Origin": APP,
                                                       "Authorization": "Bearer sk-cors"}) as r:
                assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == APP
            async with s.post(url, json=body, headers={"Origin": APP}) as r:
                assert r.status == 401  # the browser app can read why
                assert r.headers["Access-Control-Allow-Origin"] == APP
            other = dict(PREFLIGHT, Origin="https://evil.example")
            async with s.options(url, headers=other) as r:
                assert r.status == 403
                assert "Access-Control-Allow-Origin" not in r.headers
    finally:
        await srv.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


def test_https_with_a_self_signed_certificate(certificate):
    cert, key = certificate
    with ServerProcess("--ssl-certfile", cert, "--ssl-keyfile", key) as server:
        assert server.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=cert)
        req = urllib.request.Request(server.url + "/v1/completions", method="POST",
                                     data=b'{"prompt": "hi", "max_tokens": 2}',
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=trusted, timeout=60) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(server.url + "/health", timeout=30,
                                   context=ssl.create_default_context())
        plain = server.url.replace("https://", "http://") + "/health"
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(plain, timeout=30)
        assert server.terminate() == 0


def test_tls_settings_are_checked(certificate, tmp_path):
    cert, _key = certificate
    assert tls_context(None, None) is None
    with pytest.raises(ValueError, match="--ssl-certfile and --ssl-keyfile go together"):
        tls_context(cert, None)
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ValueError, match="cannot load the TLS certificate"):
        tls_context(cert, str(tmp_path / "bad.pem"))


async def test_host_header_outside_the_allowed_hosts_is_400(engine):
    srv = await _server(engine, allowed_hosts=("localhost", "127.0.0.1", "::1"))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(srv.make_url("/v1/models")) as r:
                assert r.status == 200
            async with s.get(srv.make_url("/v1/models"), headers={"Host": "LOCALHOST:1"}) as r:
                assert r.status == 200
            for host in ("attacker.example", "attacker.example:8000", "127.0.0.2"):
                async with s.get(srv.make_url("/health"), headers={"Host": host}) as r:
                    assert r.status == 400, host
                    err = (await r.json())["error"]
                    assert err["code"] == "invalid_host" and "allowed hosts" in err["message"]
    finally:
        await srv.close()


def test_a_loopback_server_refuses_rebound_host_names():
    def status(url: str, host: str) -> int:
        req = urllib.request.Request(url + "/health", headers={"Host": host})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            return e.code

    with ServerProcess() as server:  # bound to 127.0.0.1
        assert status(server.url, "attacker.example") == 400
        assert status(server.url, "localhost:8000") == 200
        assert server.terminate() == 0
    with ServerProcess("--allowed-hosts", "llm.internal") as server:
        assert status(server.url, "llm.internal") == 200
        assert status(server.url, "localhost") == 400
        assert server.terminate() == 0
