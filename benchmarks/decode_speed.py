"""JPEG decoding on the CPU, side by side in one run: the decoder ltbench's loaders use against its
candidate replacements, for speed and for bit-identical output; and what decoding the next batch in a
background thread (``device_decode.decode_ahead``) hides behind a training step.

Why: torchvision's image decoding is deprecated since 0.29 in favour of TorchCodec, and ``augment_on:
worker`` promises bit-identical runs, so a decoder may replace the current one only if its pixels are the
same and it is not slower. DALI's CPU decoder and PIL are measured beside them when importable.

Decoders (each on the same files, one thread, alternating rounds, median img/s):
  torchvision decode_image(path)   what FileImages does for every ImageNet-size training image (the reference)
  torchvision decode_jpeg(bytes)   the same decoder given the bytes (device_decode's CPU fallback)
  PIL open().convert('RGB')        Pillow, then a uint8 CHW tensor
  torchcodec decode_image(path)    TorchCodec (optional: pip install torchcodec)
  DALI decoders.image (cpu)        NVIDIA DALI's CPU decoder, one thread, synchronous (optional: nvidia-dali-cuda130)

Identity is checked on JPEG flavours a real dataset holds (all 333x251): torchvision-encoded qualities,
Pillow's 4:4:4, 4:2:2 and 4:2:0 chroma subsampling, progressive and optimised files, greyscale, CMYK, and a
file with an EXIF orientation tag (torchvision and Pillow ignore it, as the methods' reference loaders do).

    .venv/bin/python benchmarks/decode_speed.py [--seconds 1.5] [--rounds 3] [--skip-ahead]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, encode_jpeg

from data_throughput import make_jpegs

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision are deprecated")


def reference(path: Path) -> torch.Tensor:
    return decode_image(str(path), mode=ImageReadMode.RGB)


def pil_decode(path: Path) -> torch.Tensor:
    from PIL import Image
    from torchvision.transforms.functional import pil_to_tensor

    with Image.open(path) as image:
        return pil_to_tensor(image.convert("RGB"))


def torchcodec_decoder():
    """TorchCodec's format-detecting decoder (RGB uint8 CHW), or None when it is not installed or loadable."""
    try:
        from torchcodec.decoders import decode_image as tc_decode
    except Exception:  # noqa: BLE001 - not installed, or built for another torch
        return None
    return lambda path: tc_decode(str(path), mode="RGB")


def dali_decoder(batch: int):
    """DALI's CPU decoder as a function of a list of paths (one pipeline run per ``batch`` files), or None."""
    try:
        from nvidia.dali import fn, pipeline_def, types
    except Exception:  # noqa: BLE001
        return None
    pending: list[np.ndarray] = []

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, exec_async=False, exec_pipelined=False,
                  prefetch_queue_depth=1)
    def pipe():
        data = fn.external_source(source=lambda: pending, batch=True, dtype=types.UINT8)
        return fn.decoders.image(data, device="cpu", output_type=types.RGB)

    p = pipe()
    p.build()

    def decode(paths: list[Path]) -> list[torch.Tensor]:
        pending[:] = [np.fromfile(path, dtype=np.uint8) for path in paths]
        out, = p.run()
        return [torch.from_numpy(np.array(out[i])).permute(2, 0, 1) for i in range(len(paths))]

    return decode


def flavours(folder: Path) -> dict[str, Path]:
    """JPEG files of the kinds a real dataset holds (name -> path), made here."""
    from PIL import Image

    gen = torch.Generator().manual_seed(1)
    low = torch.rand(1, 3, 8, 8, generator=gen)
    smooth = torch.nn.functional.interpolate(low, size=(251, 333), mode="bicubic", align_corners=False)[0]
    rgb = ((smooth + 0.08 * torch.randn(3, 251, 333, generator=gen)).clamp(0, 1) * 255).to(torch.uint8)
    pil = Image.fromarray(rgb.permute(1, 2, 0).numpy())
    out = {}
    for quality in (75, 90, 95):
        out[f"torchvision q{quality}"] = encode_jpeg(rgb, quality=quality).numpy().tobytes()
    for name, options in {"Pillow 4:4:4": {"subsampling": 0}, "Pillow 4:2:2": {"subsampling": 1},
                          "Pillow 4:2:0": {"subsampling": 2}, "Pillow progressive": {"progressive": True},
                          "Pillow optimised": {"optimize": True}}.items():
        out[name] = pil_bytes(pil, quality=90, **options)
    out["Pillow greyscale"] = pil_bytes(pil.convert("L"), quality=90)
    out["Pillow CMYK"] = pil_bytes(pil.convert("CMYK"), quality=90)
    exif = pil.getexif()
    exif[0x0112] = 6  # EXIF orientation: a viewer shows the image turned 90 degrees
    out["Pillow EXIF-rotated"] = pil_bytes(pil, quality=90, exif=exif.tobytes())
    paths = {}
    for i, (name, data) in enumerate(out.items()):
        paths[name] = folder / f"flavour{i}.jpg"
        paths[name].write_bytes(data)
    return paths


def pil_bytes(image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **options)
    return buffer.getvalue()


def identity_table(decoders: dict, files: dict[str, Path]) -> None:
    """Per decoder: on how many flavours its pixels equal the reference's, and the largest difference."""
    print(f"\nbit-identical to torchvision decode_image, per JPEG flavour ({', '.join(files)}):")
    for name, decode in decoders.items():
        same, worst, notes = 0, 0, []
        for flavour, path in files.items():
            try:
                image = decode([path])[0]
            except Exception as exc:  # noqa: BLE001 - a decoder that refuses a flavour is reported, not fatal
                notes.append(f"{flavour}: {type(exc).__name__}")
                continue
            ref = reference(path)
            if image.shape != ref.shape:
                notes.append(f"{flavour}: shape {tuple(image.shape)}")
                continue
            diff = int((image.int() - ref.int()).abs().max())
            same += diff == 0
            worst = max(worst, diff)
            if diff:
                notes.append(f"{flavour}: max diff {diff}")
        print(f"  {name:34s} {same}/{len(files)} identical, max |diff| {worst}" + (f" ({'; '.join(notes)})" if notes else ""))


def rate(decode, paths: list[Path], seconds: float, batch: int) -> float:
    """Images per second over about ``seconds`` (whole batches over the cycling file list)."""
    done, start = 0, time.perf_counter()
    while True:
        for i in range(0, len(paths), batch):
            done += len(decode(paths[i:i + batch]))
            if time.perf_counter() - start > seconds:
                return done / (time.perf_counter() - start)


def speed_table(decoders: dict, paths: list[Path], seconds: float, rounds: int, batch: int) -> None:
    rates: dict[str, list[float]] = {name: [] for name in decoders}
    for r in range(rounds):
        order = list(decoders) if r % 2 == 0 else list(reversed(decoders))
        for name in order:
            rates[name].append(rate(decoders[name], paths, seconds, batch))
    base = statistics.median(rates["torchvision decode_image(path)"])
    print(f"\nCPU decoding of {len(paths)} ImageNet-size JPEGs, 1 thread, median of {rounds} alternating rounds:")
    print(f"  {'decoder':34s} {'img/s':>8s} {'vs reference':>12s}   rounds")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"  {name:34s} {median:8.0f} {median / base:11.2f}x   {' '.join(f'{v:.0f}' for v in values)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="timed seconds per decoder and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    ap.add_argument("--batch", type=int, default=32, help="files per call (DALI decodes a batch per run)")
    ap.add_argument("--skip-ahead", action="store_true", help="skip the decode-ahead measurement")
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    each = lambda f: (lambda paths: [f(p) for p in paths])  # noqa: E731
    decoders = {"torchvision decode_image(path)": each(reference),
                "torchvision decode_jpeg(bytes)": each(lambda p: decode_jpeg(np_bytes(p), mode=ImageReadMode.RGB)),
                "PIL open().convert('RGB')": each(pil_decode)}
    versions = [f"torch {torch.__version__}", f"torchvision {__import__('torchvision').__version__}"]
    if (tc := torchcodec_decoder()) is not None:
        decoders["torchcodec decode_image(path)"] = each(tc)
        versions.append(f"torchcodec {__import__('torchcodec').__version__}")
    if (dali := dali_decoder(args.batch)) is not None:
        decoders["DALI decoders.image (cpu)"] = dali
        versions.append(f"DALI {__import__('nvidia.dali').dali.__version__}")
    print(", ".join(versions) + f"; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="ltbench-decode-") as tmp:
        paths = make_jpegs(Path(tmp), 32)
        identity_table(decoders, flavours(Path(tmp)))
        speed_table(decoders, paths, args.seconds, args.rounds, args.batch)
        if not args.skip_ahead:
            ahead_table(paths, args.rounds)
    print(f"({time.perf_counter() - started:.0f} s; load average at end {os.getloadavg()[0]:.1f})")


def np_bytes(path: Path) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8))


def ahead_table(paths: list[Path], rounds: int, batch: int = 16, batches: int = 8) -> None:
    """Wall and CPU seconds for ``batches`` steps of (decode a batch, then a training-step stand-in of about
    the same CPU time in this thread), decoding in the loop against ``decode_ahead`` (the next batch in a
    background thread). With a free core the wall time approaches max(decode, step) instead of their sum;
    the CPU time says what the thread costs (nothing, if the two modes agree)."""
    from ltbench.data.device_decode import decode_ahead, decode_batch

    cpu = torch.device("cpu")
    encoded = [[np_bytes(p) for p in paths[i % 2 * batch:][:batch]] for i in range(batches)]
    loader = lambda: (([b], torch.zeros(len(b))) for b in encoded)  # noqa: E731
    decode_cpu_s = cpu_seconds(lambda: decode_batch(encoded[0], cpu))
    weights = torch.randn(384, 384)
    reps = max(1, round(decode_cpu_s / max(cpu_seconds(lambda: [weights @ weights for _ in range(10)]) / 10, 1e-6)))
    step = lambda: [weights @ weights for _ in range(reps)]  # noqa: E731
    results: dict[str, list[tuple[float, float]]] = {"in the loop": [], "decode_ahead": []}
    for r in range(rounds):
        for mode in (list(results) if r % 2 == 0 else list(reversed(results))):
            t0, c0 = time.perf_counter(), time.process_time()
            batches_in = (([decode_batch(v[0], cpu)], y) for v, y in loader()) if mode == "in the loop" \
                else decode_ahead(loader(), cpu)
            for _ in batches_in:
                step()
            results[mode].append((time.perf_counter() - t0, time.process_time() - c0))
    (loop, loop_cpu), (ahead, ahead_cpu) = ((statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
                                            for v in results.values())
    print(f"\n{batches} steps of (decode {batch} JPEGs, then a step stand-in of the same CPU time, "
          f"{decode_cpu_s * 1e3:.0f} ms), 1 torch thread, median of {rounds} alternating rounds:")
    print(f"  in the loop: {loop:.2f} s wall, {loop_cpu:.2f} s CPU; decode_ahead: {ahead:.2f} s wall, {ahead_cpu:.2f} s "
          f"CPU; wall ratio {loop / ahead:.2f}x (ceiling 2x, reached only with a free core for the thread)")


def cpu_seconds(f) -> float:
    c0 = time.process_time()
    f()
    return time.process_time() - c0


if __name__ == "__main__":
    sys.exit(main())
