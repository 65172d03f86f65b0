"""The stub's transcript segments and subtitles (stub/audio.py): pure. (Its endpoints over a
loopback socket: test_media.py.)"""

from __future__ import annotations

from homelab_frontend.stub import audio


def test_subtitles_are_numbered_srt_and_webvtt_with_their_own_time_separators():
    segments = [(0.0, 1.5, " One."), (1.5, 3723.25, " Two.")]
    assert audio._srt(segments) == "1\n00:00:00,000 --> 00:00:01,500\n One.\n\n2\n00:00:01,500 --> 01:02:03,250\n Two.\n\n"
    assert audio._vtt(segments).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\n One.\n\n")


def test_segments_split_the_duration_evenly_and_cycle_the_transcript():
    segs = audio._segments(3, 3.0)
    assert [(a, b) for a, b, _ in segs] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
    assert all(t.startswith(" ") for _, _, t in segs)
    assert [t for _, _, t in audio._segments(len(audio.TRANSCRIPT) + 1, 1.0)][-1] == " " + audio.TRANSCRIPT[0]
    assert audio._segments(0, 0.0) == [(0.0, 1.0, " " + audio.TRANSCRIPT[0])]  # at least one, a second long


def test_stamps_round_to_the_millisecond():
    assert audio._stamp(0.0004, True) == "00:00:00,000"
    assert audio._stamp(59.9996, False) == "00:01:00.000"
    assert audio._stamp(36000.5, True) == "10:00:00,500"
