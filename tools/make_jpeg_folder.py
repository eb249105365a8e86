"""Write a realistic image folder for ``folder:PATH``: photo-like JPEGs of mixed sizes.

ImageNet-like files: every side between ``--min-side`` and ``--max-side``
pixels (300-600 by default, mean about 450x450 like ImageNet's ~500x375),
quality 90, content with the statistics that decide a JPEG's size and decode
time: a smooth colour gradient, low-frequency blotches, sensor-like noise and
a few solid shapes. The shapes carry the class (ellipses, boxes, triangles,
stripes, ...), so a classifier, and a pretrained backbone fine-tuned on it,
has something to learn. Deterministic for a given ``--seed``.

Example:
    python tools/make_jpeg_folder.py benchmarks/data/photos3000 --images 3000 --classes 4
    mirrorkit bench --input-only --dataset folder:benchmarks/data/photos3000 --augment crop

benchmarks/data/ is git-ignored: generated images are never committed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: Class folders, in label order; the drawing of each is in :func:`_draw_shape`.
CLASS_NAMES = ("ellipses", "boxes", "triangles", "stripes", "rings", "crosses")


def _background(rng, height: int, width: int):
    import numpy as np

    # A diagonal gradient between two random colours ...
    t = (np.linspace(0, 1, width)[None, :] * rng.uniform(-1, 1)
         + np.linspace(0, 1, height)[:, None] * rng.uniform(-1, 1))
    t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    image = a + t[..., None] * (b - a)
    # ... low-frequency blotches (an 8x8 grid of colours, upsampled) ...
    grid = rng.normal(0, 30, (8, 8, 3))
    ys = np.linspace(0, 7, height).astype(int)
    xs = np.linspace(0, 7, width).astype(int)
    image += grid[ys][:, xs]
    # ... and sensor-like noise, the part that makes photos large as JPEG.
    image += rng.normal(0, 14, (height, width, 3))
    return image


def _draw_shape(draw, label: int, rng, height: int, width: int) -> None:
    colour = tuple(int(c) for c in rng.integers(0, 256, 3))
    cx, cy = rng.uniform(0.2, 0.8) * width, rng.uniform(0.2, 0.8) * height
    r = rng.uniform(0.08, 0.25) * min(height, width)
    kind = label % len(CLASS_NAMES)
    if kind == 0:
        draw.ellipse([cx - r, cy - r * 0.7, cx + r, cy + r * 0.7], fill=colour)
    elif kind == 1:
        draw.rectangle([cx - r, cy - r, cx + r * 0.8, cy + r * 1.1], fill=colour)
    elif kind == 2:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    elif kind == 3:
        for k in range(-2, 3):
            x = cx + k * r * 0.5
            draw.line([(x, cy - r), (x + r * 0.3, cy + r)], fill=colour, width=max(2, int(r / 8)))
    elif kind == 4:
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=colour, width=max(3, int(r / 5)))
    else:
        w = max(3, int(r / 4))
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=colour)
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=colour)


def make_image(label: int, rng, min_side: int = 300, max_side: int = 600):
    """One photo-like PIL image of class ``label``, each side in ``[min_side, max_side]``.

    Example:
        >>> import numpy as np
        >>> make_image(0, np.random.default_rng(0)).mode
        'RGB'
    """
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    height, width = (int(v) for v in rng.integers(min_side, max_side + 1, 2))
    image = Image.fromarray(np.clip(_background(rng, height, width), 0, 255).astype("uint8"))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 5))):
        _draw_shape(draw, label, rng, height, width)
    # Soft edges, as a lens gives; then noise again over the shapes.
    image = image.filter(ImageFilter.GaussianBlur(0.8))
    pixels = np.asarray(image, dtype="float32") + rng.normal(0, 10, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype("uint8"))


def write_folder(root: str | Path, *, images: int = 3000, classes: int = 4, seed: int = 0,
                 min_side: int = 300, max_side: int = 600, quality: int = 90) -> dict:
    """Write ``images`` JPEGs into ``root/<class>/NNNNN.jpg``, round-robin over ``classes``.

    Returns:
        ``{"images": N, "classes": [...], "bytes": total, "root": str}``.

    Raises:
        ValueError: for a bad count, class number or side range, or a
            ``root`` that already holds files.

    Example:
        >>> write_folder("/tmp/photos", images=20, classes=2)   # doctest: +SKIP
    """
    import numpy as np

    if images < classes or not 2 <= classes <= len(CLASS_NAMES):
        raise ValueError(f"Need 2 to {len(CLASS_NAMES)} classes and at least one image per "
                         f"class. Received: images={images}, classes={classes}")
    if not 1 <= min_side <= max_side:
        raise ValueError(f"Need 1 <= min_side <= max_side. Received: min_side={min_side}, "
                         f"max_side={max_side}")
    root = Path(root).expanduser()
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} is not empty; choose a new folder. Received: root={str(root)!r}")
    rng = np.random.default_rng(seed)
    names = CLASS_NAMES[:classes]
    total = 0
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
    for i in range(images):
        label = i % classes
        path = root / names[label] / f"{i:05d}.jpg"
        make_image(label, rng, min_side, max_side).save(path, quality=quality)
        total += path.stat().st_size
    return {"images": images, "classes": list(names), "bytes": total, "root": str(root)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="new or empty folder to write")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-side", type=int, default=300)
    parser.add_argument("--max-side", type=int, default=600)
    parser.add_argument("--quality", type=int, default=90)
    args = parser.parse_args(argv)
    try:
        info = write_folder(args.root, images=args.images, classes=args.classes, seed=args.seed,
                            min_side=args.min_side, max_side=args.max_side,
                            quality=args.quality)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {info['images']} JPEGs ({info['bytes'] / 1e6:.1f} MB, "
          f"{info['bytes'] / info['images'] / 1e3:.0f} kB each) in {len(info['classes'])} "
          f"classes ({', '.join(info['classes'])}) to {info['root']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
