"""Decoding real image, audio and video files (made by Pillow and FFmpeg)."""

import io

import numpy as np
import pytest
from PIL import Image

from mlxbun_core.errors import BadRequest
from mlxbun_core.media import decode as D
from mlxbun_core.testing import media as M


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "AVIF", "HEIF"])
def test_common_image_formats(fmt):
    img = D.decode_image(M.image_bytes(fmt, size=(40, 24), color=(200, 30, 60)))
    assert img.mode == "RGB" and img.size == (40, 24)
    r, g, b = img.getpixel((20, 12))
    assert abs(r - 200) < 30 and abs(g - 30) < 30 and abs(b - 60) < 30


def test_transparency_is_laid_on_white_and_gif_takes_its_first_frame():
    img = D.decode_image(M.image_bytes("PNG", color=(0, 0, 0, 0), mode="RGBA"))
    assert img.getpixel((0, 0)) == (255, 255, 255)
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    assert D.decode_image(buf.getvalue()).getpixel((4, 4))[0] > 200


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 20), (10, 200, 10))
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90° clockwise on display
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif)
    assert D.decode_image(buf.getvalue()).size == (20, 40)


def test_bad_images_are_400s():
    for bad in (b"", b"not an image", M.image_bytes("PNG")[:40]):
        with pytest.raises(BadRequest, match="image could not be decoded") as info:
            D.decode_image(bad)
        assert info.value.status == 400


def test_decompression_bomb_is_refused(monkeypatch):
    monkeypatch.setattr(D, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(BadRequest, match="megapixels"):
        D.decode_image(M.image_bytes("PNG", size=(100, 100)))


@pytest.mark.parametrize("bits,float_fmt", [(8, False), (16, False), (24, False), (32, False),
                                            (32, True), (64, True)])
def test_wav_sample_formats(bits, float_fmt):
    x = M.tone(0.5, rate=16_000)
    out = D.decode_audio(M.wav_bytes(x, 16_000, bits, float_fmt))
    assert out.dtype == np.float32 and out.shape == (8000,)
    tol = 0.02 if bits == 8 else 1e-3
    assert np.abs(out - x[:, 0]).max() < tol


def test_wav_stereo_44k_is_mixed_and_resampled():
    left = M.tone(1.0, rate=44_100, freq=440)
    stereo = np.concatenate([left, np.zeros_like(left)], axis=1)
    out = D.decode_audio(M.wav_bytes(stereo, 44_100))
    assert out.shape == (16_000,)
    ref = M.tone(1.0, rate=16_000, freq=440)[:, 0] / 2  # mean of a tone and silence
    assert np.abs(out[200:-200] - ref[200:-200]).max() < 0.01


def test_audio_is_capped_at_30_seconds():
    out = D.decode_audio(M.wav_bytes(M.tone(31.0, rate=8000), 8000))
    assert out.shape == (30 * 16_000,)


@pytest.mark.parametrize("container,codec", [("mp3", "mp3"), ("flac", "flac"), ("ogg", "libopus"),
                                             ("adts", "aac")])
def test_compressed_audio_through_pyav(container, codec):
    rate = 48_000 if codec == "libopus" else 22_050  # Opus encodes at 48 kHz only
    x = M.tone(1.0, rate=rate, freq=300, channels=2)
    out = D.decode_audio(M.encoded_audio(x, rate, container, codec))
    assert out.dtype == np.float32 and abs(out.shape[0] - 16_000) < 1600
    # the tone survives: its spectrum peaks at 300 Hz
    spec = np.abs(np.fft.rfft(out[:16000] if out.shape[0] >= 16000 else out))
    peak_hz = np.argmax(spec) * 16_000 / (2 * (len(spec) - 1))
    assert abs(peak_hz - 300) < 10


def test_bad_audio_is_a_400():
    for bad in (b"RIFF\x00\x00\x00\x00WAVE", b"definitely not audio" * 10):
        with pytest.raises(BadRequest, match="audio could not be decoded"):
            D.decode_audio(bad)


def test_video_is_sampled_at_2_fps():
    clip = D.decode_video(M.video_bytes(seconds=3.0, fps=10, size=(64, 48)))
    assert clip.frames.dtype == np.uint8 and clip.frames.shape == (6, 48, 64, 3)
    assert clip.source_fps == 10 and clip.frames_indices == [0, 5, 10, 15, 20, 25]
    assert clip.total_num_frames == 30 and abs(clip.duration_s - 3.0) < 0.2
    # frames differ over time (the sampler did not repeat one frame)
    assert not np.array_equal(clip.frames[0], clip.frames[1])


def test_video_frame_cap_and_budget(monkeypatch):
    clip = D.decode_video(M.video_bytes(seconds=3.0, fps=10), max_frames=4)
    assert clip.frames.shape[0] == 4
    monkeypatch.setattr(D, "VIDEO_FRAME_PIXELS", 32 * 24)
    small = D.decode_video(M.video_bytes(seconds=1.0, fps=10, size=(64, 48)))
    assert small.frames.shape[1] * small.frames.shape[2] <= 32 * 24


def test_bad_video_is_a_400():
    with pytest.raises(BadRequest, match="video could not be decoded"):
        D.decode_video(b"\x00\x00\x00\x18ftypmp42" + b"junk" * 100)
    with pytest.raises(BadRequest, match="no video stream"):
        D.decode_video(M.encoded_audio(M.tone(0.5), 16_000, "mp3", "mp3"))
