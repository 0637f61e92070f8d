"""Reading a host's /proc/net/tcp{,6} for the gateway forward's bound addresses
(``ssh.forward``): what counts as loopback on either byte order, and what does not."""

from __future__ import annotations

import re

from fanout.transports.ssh.forward import beyond_loopback, listen_script

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"


def _line(address: str, port: int = 0x9C41, state: str = "0A") -> str:
    zero = "0" * len(address)
    return f"   0: {address}:{port:04X} {zero}:0000 {state} 00000000:00000000 00:00000000 0"


def test_loopback_in_either_byte_order_is_loopback() -> None:
    lines = [
        _line("0100007F"),
        _line("7F000001"),
        _line("00000000000000000000000001000000"),
        _line("00000000000000000000000000000001"),
        _line("0000000000000000FFFF00000100007F"),
    ]
    assert beyond_loopback("\n".join(lines)) == []


def test_wildcards_and_other_addresses_are_named() -> None:
    lines = [_line("0100007F"), _line("00000000"), _line("0" * 32), _line("0A00020F")]
    assert beyond_loopback("\n".join(lines)) == ["0.0.0.0", "[::]", "0A00020F"]


def test_no_listening_socket_means_nothing_is_known() -> None:
    assert beyond_loopback("") is None
    assert beyond_loopback("\n  \n") is None


def test_the_script_matches_only_listening_sockets_on_the_port() -> None:
    pattern = re.search(r"-E '([^']*)'", listen_script(0x9C41))
    assert pattern is not None
    matching = re.compile(pattern.group(1))
    assert matching.search(_line("0100007F"))
    assert matching.search(_line("0" * 32))
    assert not matching.search(HEADER)
    assert not matching.search(_line("0100007F", state="01"))  # established, not listening
    assert not matching.search(_line("0100007F", port=0x9C42))
    assert not matching.search(_line("0100007F", port=0x19C41))
