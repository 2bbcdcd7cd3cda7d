"""The test bed's throw-away PKI: a CA, the API server's serving certificate, service-account
signing keys and client certificates (a kubelet's, the API server's towards kubelets)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support import ports


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Pki:
    """Files of the throw-away PKI: a CA, the API server's serving cert, service-account keys."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    # The API server's client certificate towards kubelets (logs, exec, port-forward).
    kubelet_client_cert: Path
    kubelet_client_key: Path

    @classmethod
    def generate(cls, directory: Path, service_ip_range: str, extra_ips: Sequence[str] = ()) -> Pki:
        """A fresh CA and the files signed by it; the API server's certificate names
        loopback, the first address of `service_ip_range` (the `kubernetes` Service) and
        `extra_ips`."""
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        start = now - datetime.timedelta(hours=1)
        end = now + datetime.timedelta(days=7)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainjob-test-ca")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .sign(ca_key, hashes.SHA256())
        )

        serving_key = ec.generate_private_key(ec.SECP256R1())
        first_service_ip = next(ipaddress.IPv4Network(service_ip_range).hosts())
        sans: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
            x509.IPAddress(ipaddress.IPv4Address(ports.LOOPBACK)),
            x509.IPAddress(first_service_ip),
            *(x509.IPAddress(ipaddress.IPv4Address(ip)) for ip in extra_ips),
        ]
        serving_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name)
            .public_key(serving_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )

        sa_key = ec.generate_private_key(ec.SECP256R1())
        sa_pub = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

        pki = cls(
            ca_cert=directory / "ca.crt",
            ca_key=directory / "ca.key",
            serving_cert=directory / "apiserver.crt",
            serving_key=directory / "apiserver.key",
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
            kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
            kubelet_client_key=directory / "apiserver-kubelet-client.key",
        )
        pki.ca_cert.write_bytes(_pem_cert(ca_cert))
        pki.ca_key.write_bytes(_pem_key(ca_key))
        pki.serving_cert.write_bytes(_pem_cert(serving_cert))
        pki.serving_key.write_bytes(_pem_key(serving_key))
        pki.sa_key.write_bytes(_pem_key(sa_key))
        pki.sa_pub.write_bytes(sa_pub)
        for key_file in (pki.ca_key, pki.serving_key, pki.sa_key):
            key_file.chmod(0o600)
        pki.client_cert(
            "kube-apiserver-kubelet-client",
            "system:masters",
            pki.kubelet_client_cert,
            pki.kubelet_client_key,
        )
        return pki

    def client_cert(self, common_name: str, organization: str, cert: Path, key: Path) -> None:
        """Write a client certificate signed by the CA: the API server maps CN to the user
        and O to the group (a kubelet is CN=system:node:<name>, O=system:nodes)."""
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{self.ca_key} is not an EC key")
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        now = datetime.datetime.now(datetime.timezone.utc)
        client_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )
        signed = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(client_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert.write_bytes(_pem_cert(signed))
        key.write_bytes(_pem_key(client_key))
        key.chmod(0o600)
