"""RFC 7541's Huffman code (Appendix B) for the endpoint picker's HPACK decoder
(``router.picker_hpack``): decoding a string, and encoding one (for tests and
clients). The code is canonical: every symbol's code follows from the code lengths
alone, codes of one length consecutive in symbol order, so the table below lists which
symbols have which length and the codes are computed (the check in ``_canonical``: the
lengths fill the code space exactly, and EOS is 30 ones).

Errors are ``HpackError``. Must not know header blocks.
"""

from __future__ import annotations

from functools import lru_cache

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
