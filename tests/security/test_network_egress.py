"""Issue 13, item 3 and issue 12, item 12: under `network: services` the agent reaches its own
services, gateway and tool proxy, and nothing else of the server. The test is the attack: an
agent run by `keystone run` under bubblewrap, with a PostgreSQL and a MySQL service and the
model gateway, tries the server's own PostgreSQL as its admin, the MariaDB root login, Redis,
a web port and the cloud metadata address. Each must fail, while its own database works."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from evaluations.runner.sandbox import bwrap_status
from tests.cli_helpers import embedded_env, run_keystone

pytestmark = pytest.mark.skipif(
    not bwrap_status()[0], reason=f"bubblewrap does not work here: {bwrap_status()[1]}"
)

AGENT = r"""
import json, os, socket, urllib.request
import psycopg, pymysql
from urllib.parse import urlsplit

seen = {}
def attempt(name, action):
    try:
        seen[name] = "ok: " + str(action())
    except Exception as exc:
        seen[name] = f"refused: {type(exc).__name__}: {exc}"

own = os.environ["KEYSTONE_SERVICE_SHOP_DSN"]
attempt("own_database", lambda: psycopg.connect(own).execute("SELECT count(*) FROM items").fetchone()[0])
# The same server, the same port, the admin login (trusted by this machine's pg_hba).
attempt("server_postgres", lambda: psycopg.connect(
    "postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3).execute("SELECT 1").fetchone())
parts = urlsplit(os.environ["KEYSTONE_SERVICE_LEGACY_DSN"])
attempt("own_mysql", lambda: pymysql.connect(host=parts.hostname, port=parts.port,
    user=parts.username, password=urllib.parse.unquote(parts.password),
    database=parts.path[1:]).cursor().execute("SELECT 1"))
attempt("mysql_root", lambda: pymysql.connect(host="127.0.0.1", port=3306, user="root",
    connect_timeout=3).cursor().execute("SELECT 1"))
def talk(port):
    # A trap (egress.py) accepts and closes without a byte: only an answer is a reach.
    with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
        conn.sendall(b"PING\r\n")
        answer = conn.recv(100)
    if not answer:
        raise ConnectionError("closed without a byte")
    return answer
for name, port in (("redis", 6379), ("web", int(os.environ["WEB_PORT"]))):
    attempt(name, lambda port=port: talk(port))
attempt("metadata", lambda: socket.create_connection(("169.254.169.254", 80), timeout=3) and "connected")
models = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/models",
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
attempt("gateway", lambda: urllib.request.urlopen(models, timeout=5).status)
print(json.dumps(seen))
"""

SPEC = """
version: 1
id: egress-attack
task: {prompt: "try everything"}
agent:
  type: command
  command: python agent.py
  env: {WEB_PORT: "{web_port}"}
sandbox: {backend: bwrap, network: services, workspace: ./ws}
llm:
  provider: scripted
  rules:
    - {reply: {content: "hello"}}
services:
  - name: shop
    type: postgres
    sql: "CREATE TABLE items (id int); INSERT INTO items VALUES (1), (2);"
  - name: legacy
    type: mysql
    sql: "CREATE TABLE t (id int);"
invariants:
  ran:
    description: "the agent reported"
    check: {type: contains, value: own_database}
"""


def test_agent_reaches_its_own_services_and_nothing_else_of_the_server(tmp_path: Path) -> None:
    web = socket.socket()  # stands for the server's web port: listening on the host
    web.bind(("127.0.0.1", 0))
    web.listen()
    accepted = threading.Event()

    def accept() -> None:
        web.settimeout(30)
        try:
            web.accept()
            accepted.set()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "agent.py").write_text(AGENT)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("{web_port}", str(web.getsockname()[1])))
    report = tmp_path / "report.json"
    env = embedded_env(
        tmp_path / "home",
        KEYSTONE_POSTGRES_URL="postgresql://postgres@127.0.0.1:5432/postgres",
        KEYSTONE_MYSQL_URL="mysql://root@127.0.0.1:3306/",
        KEYSTONE_POLICY_MIN_BACKEND="bwrap",
    )
    done = run_keystone("run", str(spec), "--json", str(report), env=env, timeout=180)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    execution = json.loads(report.read_text())["executions"][0]
    seen = json.loads(execution["output"])

    assert seen["own_database"] == "ok: 2"
    assert seen["own_mysql"].startswith("ok")
    assert seen["gateway"] == "ok: 200"
    assert "may log in only as" in seen["server_postgres"], seen["server_postgres"]
    assert "may log in only as" in seen["mysql_root"], seen["mysql_root"]
    for name in ("redis", "web"):
        assert seen[name].startswith("refused"), (name, seen[name])
    assert seen["metadata"].startswith("refused"), seen["metadata"]
    assert not accepted.is_set()
    web.close()
