"""A real reverse proxy in front of a test's gateway: Debian's nginx or Caddy, each from a config
written into a tmp dir of its own (listening on a free loopback port, logs and pid there), run in
the foreground as the test's child, and gone (its whole process tree) when the block ends.

The `location` block and the Caddy site are the ones docs/operations.md shows: change one, change
the other."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import proctree
from bench.childproc import START_GUARD_S
from stubproc import free_port

# docs/operations.md, "Behind a reverse proxy": the nginx location, as tested ({gw}: host:port).
# nginx's own defaults otherwise: proxy_buffering on, HTTP/1.0 to the gateway, under which nginx
# holds a whole stream back unless the answer says X-Accel-Buffering: no (measured: through a
# location deaf to the header, all of a 1 s stream's frames reached the client in one read at
# its end; with proxy_http_version 1.1 this nginx 1.22 passes chunked frames on either way)
NGINX_LOCATION = """\
        proxy_pass http://{gw};
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_read_timeout 1h;
        proxy_send_timeout 1h;
        client_max_body_size 32m;
"""

NGINX_CONF = """\
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 128; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{
{location}        }}
        # the control: the same, but deaf to the gateway's X-Accel-Buffering (nginx's default
        # proxy_buffering on then applies): what a stream looked like without the header
        location /deaf/ {{
            proxy_ignore_headers X-Accel-Buffering;
{deaf}        }}
    }}
}}
"""

# docs/operations.md: the Caddy site, as tested. No `flush_interval -1`: Caddy streams a response
# without a length (every streamed answer) at once by itself, and an explicit -1 makes it ignore a
# client leaving (caddyserver/caddy#4952): the backend then generated on, found by this test
CADDY_SITE = """\
http://127.0.0.1:{port} {{
    reverse_proxy {gw}
}}
"""

CADDYFILE = """\
{{
    admin off
    auto_https off
    storage file_system {dir}/data
}}
""" + CADDY_SITE


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proxy:
    """One proxy process (and its workers); `url` is where clients connect."""

    def __init__(self, argv: list[str], dir: str, port: int, env: dict | None = None) -> None:
        self.dir, self.port = dir, port
        self.url = f"http://127.0.0.1:{port}"
        self._out = open(os.path.join(dir, "stdout.log"), "wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.monotonic() + START_GUARD_S
        while not _listening(port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{argv[0]} did not start:\n{self.output()}")
            time.sleep(0.05)
        self.tree = proctree.tree(self.proc.pid, include_root=True)

    def output(self) -> str:
        text = ""
        for name in ("stdout.log", "error.log"):
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    text += f.read().decode(errors="replace")
            except FileNotFoundError:
                pass
        return text

    def stop(self) -> None:
        """SIGTERM (both stop at once on it), SIGKILL of what is left after 10 s; then every
        process it ran is gone, or this raises."""
        # every process it ran: nginx's master listens before it forks its worker
        tree = {**getattr(self, "tree", {}), **proctree.tree(self.proc.pid, include_root=True)}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                proctree.kill_all(tree)
                self.proc.wait()
        self._out.close()
        try:
            proctree.wait_all_gone(tree, 10)  # the master and every worker it ran
        except AssertionError:
            proctree.kill_all(tree)
            raise
        assert not _listening(self.port)

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def nginx(gw_hostport: str) -> Proxy:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    d = tempfile.mkdtemp(prefix="hlf-nginx-")
    os.chmod(d, 0o755)  # nginx's workers run as nobody when it starts as root: they need to reach it
    port = free_port()
    location = NGINX_LOCATION.format(gw=gw_hostport)
    indent = lambda text: "".join("    " + line + "\n" for line in text.splitlines())  # noqa: E731
    conf = NGINX_CONF.format(dir=d, port=port, location=indent(location),
                             deaf=indent(NGINX_LOCATION.format(gw=gw_hostport + "/")))
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    return Proxy([binary, "-p", d, "-e", os.path.join(d, "error.log"), "-c", path], d, port)


def caddy(gw_hostport: str) -> Proxy:
    binary = shutil.which("caddy") or "/usr/bin/caddy"
    d = tempfile.mkdtemp(prefix="hlf-caddy-")
    port = free_port()
    path = os.path.join(d, "Caddyfile")
    with open(path, "w") as f:
        f.write(CADDYFILE.format(dir=d, port=port, gw=gw_hostport))
    env = {"HOME": d, "XDG_DATA_HOME": os.path.join(d, "data"), "XDG_CONFIG_HOME": os.path.join(d, "config")}
    return Proxy([binary, "run", "--config", path, "--adapter", "caddyfile"], d, port, env)


def missing(name: str) -> str | None:
    """Why a proxy cannot run here (for tests/needs.require), or None."""
    if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}") and not os.path.exists(f"/usr/bin/{name}"):
        return f"needs Debian's {name}: run .ci/deps/nginx.sh"
    return None
