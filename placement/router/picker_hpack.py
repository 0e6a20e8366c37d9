"""HPACK (RFC 7541) for the endpoint picker's own HTTP/2 server (``router.picker_h2``).

Decoding is whole: the static table, the dynamic table with its size updates, integers,
literal strings raw or Huffman-coded. Envoy's HTTP/2 codec (and grpc's) index the
headers they repeat and Huffman-code most strings, so a decoder must have all of it.
The Huffman code is canonical (RFC 7541, Appendix B): every symbol's code follows from
the code lengths alone, codes of one length consecutive in symbol order, so the table
below lists which symbols have which length and the codes are computed (the check in
``_canonical``: the lengths fill the code space exactly, and EOS is 30 ones).

Encoding is what the picker needs to answer: literal fields without indexing, raw
strings, never touching the peer's table (``literal``); an answer's header blocks are
fixed, so they are built once.

Errors are ``HpackError`` (the connection's COMPRESSION_ERROR): the message says what
was wrong. Must not know HTTP/2 framing (``router.picker_h2`` does).
"""

from __future__ import annotations

from functools import lru_cache

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

#: Huffman code lengths: the symbols (256 is EOS) of each length, RFC 7541 Appendix B.
_LENGTHS: dict[int, tuple[int, ...]] = {
    5: (48, 49, 50, 97, 99, 101, 105, 111, 115, 116),
    6: (
        32,
        37,
        45,
        46,
        47,
        51,
        52,
        53,
        54,
        55,
        56,
        57,
        61,
        65,
        95,
        98,
        100,
        102,
        103,
        104,
        108,
        109,
        110,
        112,
        114,
        117,
    ),
    7: (58, *range(66, 88), 89, 106, 107, 113, 118, 119, 120, 121, 122),
    8: (38, 42, 44, 59, 88, 90),
    10: (33, 34, 40, 41, 63),
    11: (39, 43, 124),
    12: (35, 62),
    13: (0, 36, 64, 91, 93, 126),
    14: (94, 125),
    15: (60, 96, 123),
    19: (92, 195, 208),
    20: (128, 130, 131, 162, 184, 194, 224, 226),
    21: (153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230),
    22: (
        129,
        132,
        133,
        134,
        136,
        146,
        154,
        156,
        160,
        163,
        164,
        169,
        170,
        173,
        178,
        181,
        185,
        186,
        187,
        189,
        190,
        196,
        198,
        228,
        232,
        233,
    ),
    23: (
        1,
        135,
        137,
        138,
        139,
        140,
        141,
        143,
        147,
        149,
        150,
        151,
        152,
        155,
        157,
        158,
        165,
        166,
        168,
        174,
        175,
        180,
        182,
        183,
        188,
        191,
        197,
        231,
        239,
    ),
    24: (9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237),
    25: (199, 207, 234, 235),
    26: (192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255),
    27: (
        203,
        204,
        211,
        212,
        214,
        221,
        222,
        223,
        241,
        244,
        245,
        246,
        247,
        248,
        250,
        251,
        252,
        253,
        254,
    ),
    28: (*range(2, 9), 11, 12, *range(14, 22), *range(23, 32), 127, 220, 249),
    30: (10, 13, 22, 256),
}
_EOS = 256
#: The default (and our advertised) SETTINGS_HEADER_TABLE_SIZE.
DEFAULT_TABLE_BYTES = 4096
#: Our SETTINGS_MAX_HEADER_LIST_SIZE: a decoded list's names and values, 32 bytes more
#: each (RFC 9113, 6.5.2). A block of a few bytes can name a 4 KiB entry many times.
DEFAULT_LIST_BYTES = 64 * 1024
#: Strings longer than this are decoded afresh: the cache holds what repeats (header
#: values a gateway sends on every stream), not a peer's long strings.
_CACHED_HUFFMAN_BYTES = 128


class HpackError(ValueError):
    """A header block that cannot be decoded: the connection's COMPRESSION_ERROR."""


def _canonical() -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """Per code length, the first code and the offset of its first symbol in the
    symbols ordered by (length, symbol); and each symbol's (code, length)."""
    first: dict[int, tuple[int, int]] = {}
    codes: dict[int, int] = {}
    code, previous, offset = 0, 0, 0
    for length in sorted(_LENGTHS):
        code <<= length - previous
        first[length] = (code, offset)
        for symbol in _LENGTHS[length]:
            codes[symbol] = code
            code += 1
        offset += len(_LENGTHS[length])
        previous = length
    if code != 1 << previous or codes[_EOS] != (1 << 30) - 1:  # the lengths fill it
        raise AssertionError("the Huffman code lengths do not make a complete code")
    return first, codes


_FIRST, _CODES = _canonical()
_SYMBOLS: tuple[int, ...] = tuple(s for length in sorted(_LENGTHS) for s in _LENGTHS[length])
_COUNTS = {length: len(symbols) for length, symbols in _LENGTHS.items()}
_LENGTH_OF = {symbol: length for length, symbols in _LENGTHS.items() for symbol in symbols}


def huffman_decode(data: bytes) -> bytes:
    """A Huffman-coded string (a short one cached: the same strings come again and
    again; a long one not, so the cache's memory stays small)."""
    if len(data) <= _CACHED_HUFFMAN_BYTES:
        return _huffman_cached(data)
    return _huffman(data)


@lru_cache(maxsize=2048)
def _huffman_cached(data: bytes) -> bytes:
    return _huffman(data)


def _huffman(data: bytes) -> bytes:
    out = bytearray()
    code = length = 0
    for byte in data:
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            start = _FIRST.get(length)
            if start is None:
                continue
            index = code - start[0]
            if 0 <= index < _COUNTS[length]:
                symbol = _SYMBOLS[start[1] + index]
                if symbol == _EOS:
                    raise HpackError("EOS inside a Huffman-coded string")
                out.append(symbol)
                code = length = 0
    # What is left must be padding: fewer than 8 bits, all ones (the EOS code's first).
    if length > 7 or code != (1 << length) - 1:
        raise HpackError("bad padding at the end of a Huffman-coded string")
    return bytes(out)


def huffman_encode(text: bytes) -> bytes:
    """``text`` Huffman-coded, padded with ones (for tests and clients)."""
    bits = count = 0
    for symbol in text:
        bits = (bits << _LENGTH_OF[symbol]) | _CODES[symbol]
        count += _LENGTH_OF[symbol]
    pad = -count % 8
    bits = (bits << pad) | ((1 << pad) - 1)
    return bits.to_bytes((count + pad) // 8, "big")


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
