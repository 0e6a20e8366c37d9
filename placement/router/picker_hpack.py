"""HPACK (RFC 7541) for the endpoint picker's own HTTP/2 server (``router.picker_h2``).

Decoding is whole: the static table, the dynamic table with its size updates, integers,
literal strings raw or Huffman-coded. Envoy's HTTP/2 codec (and grpc's) index the
headers they repeat and Huffman-code most strings, so a decoder must have all of it.
The Huffman code is ``router.picker_huffman``'s.

Encoding is what the picker needs to answer: literal fields without indexing, raw
strings, never touching the peer's table (``literal``); an answer's header blocks are
fixed, so they are built once.

Errors are ``HpackError`` (the connection's COMPRESSION_ERROR): the message says what
was wrong. Must not know HTTP/2 framing (``router.picker_h2`` does).
"""

from __future__ import annotations

from placement.router.picker_huffman import HpackError, huffman_decode, huffman_encode

__all__ = [
    "DEFAULT_LIST_BYTES",
    "DEFAULT_TABLE_BYTES",
    "STATIC",
    "Decoder",
    "HpackError",
    "huffman_decode",
    "huffman_encode",
    "integer",
    "literal",
]

#: The static table (RFC 7541, Appendix A), index 1 first.
STATIC: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.encode(), value.encode())
    for name, value in (
        (":authority", ""),
        (":method", "GET"),
        (":method", "POST"),
        (":path", "/"),
        (":path", "/index.html"),
        (":scheme", "http"),
        (":scheme", "https"),
        (":status", "200"),
        (":status", "204"),
        (":status", "206"),
        (":status", "304"),
        (":status", "400"),
        (":status", "404"),
        (":status", "500"),
        ("accept-charset", ""),
        ("accept-encoding", "gzip, deflate"),
        ("accept-language", ""),
        ("accept-ranges", ""),
        ("accept", ""),
        ("access-control-allow-origin", ""),
        ("age", ""),
        ("allow", ""),
        ("authorization", ""),
        ("cache-control", ""),
        ("content-disposition", ""),
        ("content-encoding", ""),
        ("content-language", ""),
        ("content-length", ""),
        ("content-location", ""),
        ("content-range", ""),
        ("content-type", ""),
        ("cookie", ""),
        ("date", ""),
        ("etag", ""),
        ("expect", ""),
        ("expires", ""),
        ("from", ""),
        ("host", ""),
        ("if-match", ""),
        ("if-modified-since", ""),
        ("if-none-match", ""),
        ("if-range", ""),
        ("if-unmodified-since", ""),
        ("last-modified", ""),
        ("link", ""),
        ("location", ""),
        ("max-forwards", ""),
        ("proxy-authenticate", ""),
        ("proxy-authorization", ""),
        ("range", ""),
        ("referer", ""),
        ("refresh", ""),
        ("retry-after", ""),
        ("server", ""),
        ("set-cookie", ""),
        ("strict-transport-security", ""),
        ("transfer-encoding", ""),
        ("user-agent", ""),
        ("vary", ""),
        ("via", ""),
        ("www-authenticate", ""),
    )
)

#: The default (and our advertised) SETTINGS_HEADER_TABLE_SIZE.
DEFAULT_TABLE_BYTES = 4096
#: Our SETTINGS_MAX_HEADER_LIST_SIZE: a decoded list's names and values, 32 bytes more
#: each (RFC 9113, 6.5.2). A block of a few bytes can name a 4 KiB entry many times.
DEFAULT_LIST_BYTES = 64 * 1024


def integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with an N-bit prefix; ``first``: the first byte's other bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, raw strings (6.2.2)."""
    return b"\x00" + integer(len(name), 7) + name + integer(len(value), 7) + value


class Decoder:
    """One connection's HPACK decoder: its dynamic table lives as long as it does."""

    def __init__(
        self,
        max_table_bytes: int = DEFAULT_TABLE_BYTES,
        *,
        max_list_bytes: int = DEFAULT_LIST_BYTES,
    ) -> None:
        #: The limit we advertise (SETTINGS_HEADER_TABLE_SIZE); the peer may go under.
        self.max_table_bytes = max_table_bytes
        self.max_list_bytes = max_list_bytes
        self.table_bytes = max_table_bytes
        self._table: list[tuple[bytes, bytes]] = []  # newest first
        self._size = 0

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """A whole header block (HEADERS and its CONTINUATIONs) as (name, value)."""
        headers: list[tuple[bytes, bytes]] = []
        at, end, list_bytes = 0, len(block), 0
        while at < end:
            byte = block[at]
            if byte & 0x20 and not byte & 0xC0:  # dynamic table size update
                if headers:  # only at a block's start (4.2, 6.3)
                    raise HpackError("a table size update after a header field")
                size, at = self._integer(block, at, 5)
                if size > self.max_table_bytes:
                    raise HpackError(f"a table size of {size} over the {self.max_table_bytes}")
                self.table_bytes = size
                self._evict(0)
                continue
            if byte & 0x80:  # indexed field
                index, at = self._integer(block, at, 7)
                field = self._entry(index)
            elif byte & 0x40:  # literal, incremental indexing
                field, at = self._literal(block, at, 6)
                self._add(field)
            else:  # literal without indexing (0000) or never indexed (0001)
                field, at = self._literal(block, at, 4)
            list_bytes += len(field[0]) + len(field[1]) + 32
            if list_bytes > self.max_list_bytes:
                raise HpackError(f"a header list over {self.max_list_bytes} bytes")
            headers.append(field)
        return headers

    def _integer(self, block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
        limit = (1 << prefix_bits) - 1
        value = block[at] & limit
        at += 1
        if value < limit:
            return value, at
        shift = 0
        while True:
            if at >= len(block):
                raise HpackError("a header block ends inside an integer")
            byte = block[at]
            at += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, at
            if shift > 28:
                raise HpackError("an integer over 2**28 in a header block")

    def _string(self, block: bytes, at: int) -> tuple[bytes, int]:
        if at >= len(block):
            raise HpackError("a header block ends before a string")
        huffman = block[at] & 0x80
        size, at = self._integer(block, at, 7)
        if at + size > len(block):
            raise HpackError("a string runs past the end of its header block")
        raw = bytes(block[at : at + size])
        return (huffman_decode(raw) if huffman else raw), at + size

    def _literal(self, block: bytes, at: int, prefix_bits: int) -> tuple[tuple[bytes, bytes], int]:
        index, at = self._integer(block, at, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, at = self._string(block, at)
        value, at = self._string(block, at)
        return (name, value), at

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= len(STATIC):
            return STATIC[index - 1]
        dynamic = index - len(STATIC) - 1
        if index == 0 or dynamic >= len(self._table):
            raise HpackError(f"no header table entry {index}")
        return self._table[dynamic]

    def _add(self, field: tuple[bytes, bytes]) -> None:
        size = len(field[0]) + len(field[1]) + 32
        self._evict(size)
        if size <= self.table_bytes:
            self._table.insert(0, field)
            self._size += size
        # An entry larger than the table empties it and is not added (4.4).

    def _evict(self, room: int) -> None:
        table = self._table
        while table and self._size + room > self.table_bytes:
            name, value = table.pop()
            self._size -= len(name) + len(value) + 32
