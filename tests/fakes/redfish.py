"""Redfish services for the BMC tests: sushy-tools' static emulator serving DMTF mockups, and BMCs that
misbehave (one that accepts and never answers, one that trickles its answer a byte at a time).

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

MOCKUPS = Path(__file__).resolve().parents[1] / "fixtures" / "redfish"
START_SECONDS = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files in `directory`), as BMCs ship."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bmc.test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "bmc.pem", directory / "bmc.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@contextlib.contextmanager
def sushy_static(mockup: str, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """Run `sushy-static` on a mockup of tests/fixtures/redfish; yields its base URL (http://127.0.0.1:PORT,
    https:// with `tls`: a certificate and its key)."""
    directory = MOCKUPS / mockup
    assert directory.is_dir(), directory
    for _ in range(3):  # the port picked may be taken by the time the emulator binds it
        port = free_port()
        command = [sys.executable, "-m", "sushy_tools.static.main", "-i", "127.0.0.1", "-p", str(port)]
        command += ["-m", str(directory)]
        if tls is not None:
            command += ["-c", str(tls[0]), "-k", str(tls[1])]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # it prints each request
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        try:
            if _answers(url, process):
                yield url
                return
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
    raise RuntimeError(f"sushy-static did not start on {mockup}")


def _answers(url: str, process: subprocess.Popen) -> bool:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/redfish/v1/", timeout=2, context=_unchecked()) as answer:
                return answer.status == 200
        except OSError:
            time.sleep(0.05)
    return False


def _unchecked():
    import ssl

    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class SilentBmc:
    """A BMC that accepts connections and never answers: the socket stays open until close()."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.server.settimeout(0.05)
        while not self._closed.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections.append(connection)  # read nothing, say nothing

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        for connection in self.connections:
            connection.close()
        self.server.close()


class TricklingBmc:
    """A BMC that sends its headers at once and then its body one byte every `every` seconds, forever."""

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.server.settimeout(0.05)
        while not self._closed.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket) -> None:
        with connection:
            try:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                while not self._closed.is_set():
                    connection.sendall(b"1\r\n \r\n")
                    time.sleep(self.every)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self.server.close()
