"""Development certificates (`outrig certs dev DIR`) and the principal a client certificate names.

The certificates are real X.509 made with cryptography's builder: a CA, a server certificate for
localhost (DNS localhost, IP 127.0.0.1 and ::1) and a client certificate, each signed by the CA.
They are for trying TLS and mutual TLS in minutes, not for production: the CA's key sits next to
its certificate. `issue` makes whatever it is asked for (the tests forge certificates with it);
`write_dev_certificates`, behind `outrig certs dev`, refuses a client name no server accepts.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from outrig.service.security.principal import refusal

_VALID_DAYS = 365


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert: bytes
    key: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
    )


def new_ca(common_name: str = "outrig development CA") -> Issued:
    """A self-signed CA certificate and key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: Issued,
    common_name: str,
    *,
    server: bool = False,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1"),
    uri: str | None = None,
) -> Issued:
    """A certificate signed by `ca`: for a server (SANs for `hosts`) or a client (`uri` as a SAN URI)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an elliptic-curve key made by `outrig certs dev`")
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    if server:
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
    if uri is not None:
        names.append(x509.UniformResourceIdentifier(uri))
    # A server's certificate serves as a client's too: a server of a tier calls its peers with
    # it, and a peer that requires client certificates checks its purpose.
    usages = (
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        if server
        else [ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    builder = (
        _builder(_name(common_name), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _write(path: Path, data: bytes, private: bool) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def write_dev_certificates(
    directory: Path, client: str = "client", client_uri: str | None = None
) -> list[Path]:
    """Write ca.pem/ca.key, server.pem/server.key and client.pem/client.key to `directory`.

    Refuses to overwrite: an existing file is an error (FileExistsError). Refuses a client CN or
    URI that breaks the principal name rule (principal.py), before writing anything (ValueError):
    a server would refuse the certificate. The CN is checked even with a URI, which then names
    the principal, so that the certificate is usable whichever name a server reads."""
    for flag, name in (("--client", client), ("--client-uri", client_uri)):
        refused = None if name is None else refusal(name)
        if refused is not None:
            raise ValueError(f"{flag}: {refused}")
    directory.mkdir(parents=True, exist_ok=True)
    names = ("ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key")
    existing = [name for name in names if (directory / name).exists()]
    if existing:
        raise FileExistsError(f"{directory}: {', '.join(existing)} already exist(s); not overwriting")
    ca = new_ca()
    server = issue(ca, "localhost", server=True)
    client_cert = issue(ca, client, uri=client_uri)
    written = []
    for stem, issued in (("ca", ca), ("server", server), ("client", client_cert)):
        _write(directory / f"{stem}.pem", issued.cert, private=False)
        _write(directory / f"{stem}.key", issued.key, private=True)
        written += [directory / f"{stem}.pem", directory / f"{stem}.key"]
    return written


def certificate_principal(pem: bytes) -> str | None:
    """The principal a client certificate names: its first SAN URI if it has one, else its CN."""
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    if uris:
        return uris[0]
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = common[0].value if common else None
    return value if isinstance(value, str) and value else None
