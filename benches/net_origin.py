"""The loopback origin of the network benchmarks (net_proxy.py,
net_tiers.py): `/small` answers a short body, anything else `Handler.big`
MiB; plain HTTP, or HTTPS with the certificate in `tls_dir`."""
import http.server, os, socketserver, ssl, subprocess, tempfile, threading

CHUNK = b"x" * (1 << 20)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    big = 256

    def do_GET(self):
        if self.path == "/small":
            body = b"hello, small\n"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-length", str(self.big * len(CHUNK)))
        self.end_headers()
        for _ in range(self.big):
            self.wfile.write(CHUNK)

    def log_message(self, *a):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def serve(tls_dir=None):
    """Starts an origin on a free loopback port and returns the port."""
    s = Server(("127.0.0.1", 0), Handler)
    if tls_dir:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(tls_dir, "cert.pem"), os.path.join(tls_dir, "key.pem"))
        s.socket = ctx.wrap_socket(s.socket, server_side=True)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s.server_address[1]


def origins(prefix):
    """A temporary directory with a certificate for origin.test, a plain
    and a TLS origin, and a policy allowing origin.test on their two ports
    (fixed to 127.0.0.1): (dir, plain port, TLS port, policy path)."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=origin.test", "-addext", "subjectAltName=DNS:origin.test",
                    "-keyout", f"{tmp}/key.pem", "-out", f"{tmp}/cert.pem"], check=True, capture_output=True)
    plain, tls = serve(), serve(tmp)
    pol = os.path.join(tmp, "net.toml")
    with open(pol, "w") as f:
        f.write('version = 1\n[fs]\nread_exec = ["/usr", "/bin", "/lib", "/lib64", "/etc"]\n'
                'read_write = ["${PROJECT}"]\n[net]\nmode = "allowlist"\nallow = ["origin.test"]\n'
                f'ports = [{plain}, {tls}]\nhosts = {{ "origin.test" = "127.0.0.1" }}\n'
                'allow_private = ["127.0.0.1/32"]\n')
    return tmp, plain, tls, pol
