"""A PNG canvas without plotting libraries: rectangles, lines and 3x5 bitmap text, for the
benchmarks' plots (numpy and zlib only)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

# 3x5 bitmap glyphs, one row of three pixels per digit, top to bottom.
_GLYPHS = {
    "0": "75557", "1": "26227", "2": "71747", "3": "71317", "4": "55711",
    "5": "74717", "6": "74757", "7": "71111", "8": "75757", "9": "75717", ".": "00002",
    "-": "00700", " ": "00000", "%": "51245", "/": "11244", "(": "24442", ")": "42224",
    ":": "02020", "A": "25755", "B": "65656", "C": "74447", "D": "65556", "E": "74647",
    "F": "74644", "G": "74557", "H": "55755", "I": "72227", "J": "11157", "K": "55655",
    "L": "44447", "M": "57555", "N": "75555", "O": "75557", "P": "75744", "Q": "75573",
    "R": "75765", "S": "74717", "T": "72222", "U": "55557", "V": "55552", "W": "55575",
    "X": "55255", "Y": "55222", "Z": "71247",
}  # fmt: skip


class Canvas:
    def __init__(self, width: int, height: int):
        self.px = np.full((height, width, 3), 255, dtype=np.uint8)

    def rect(self, x0, y0, x1, y1, color):
        self.px[max(0, y0) : y1, max(0, x0) : x1] = color

    def line(self, x0, y0, x1, y1, color, width=2):
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for t in np.linspace(0.0, 1.0, steps + 1):
            x, y = round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t)
            self.rect(
                x - width // 2, y - width // 2, x + (width + 1) // 2, y + (width + 1) // 2, color
            )

    def text(self, x, y, s, color=(0, 0, 0), scale=2):
        for ch in s.upper():
            rows = _GLYPHS.get(ch, _GLYPHS[" "])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if int(bits) >> (2 - c) & 1:
                        self.rect(
                            x + c * scale,
                            y + r * scale,
                            x + (c + 1) * scale,
                            y + (r + 1) * scale,
                            color,
                        )
            x += 4 * scale

    def save(self, path: Path) -> None:
        height, width, _ = self.px.shape
        raw = b"".join(b"\x00" + self.px[y].tobytes() for y in range(height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (
                struct.pack(">I", len(data))
                + kind
                + data
                + struct.pack(">I", zlib.crc32(kind + data))
            )

        header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        path.write_bytes(
            b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )  # fmt: skip
