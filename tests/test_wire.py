"""The slot file contract: what the hook writes is what the agent reads."""

from __future__ import annotations

import dataclasses
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchdog.contracts import slot as wire

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Identity text: no NUL (the field is NUL-terminated), at most 127 UTF-8 bytes.
TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=40).filter(
    lambda s: len(s.encode("utf-8")) <= wire.IDENTITY_FIELD_BYTES - 1
)


def identity(**kw) -> wire.Identity:
    base = wire.Identity(
        job="job", host="h", rank=0, local_rank=0, world_size=1, pid=1234, proc_start_us=99, run_id="r:0"
    )
    return dataclasses.replace(base, **kw)


def fresh(cap: int = 8, **kw) -> bytearray:
    buf = bytearray(wire.slot_size(cap))
    wire.init_slot(buf, identity(**kw), cap, wall_ns=111, mono_ns=222)
    return buf


def set_word(buf, index: int, value: int) -> None:
    struct.pack_into("<q", buf, index * wire.WORD, value)


def put_record(buf, cap: int, rec_index: int, kind: int = wire.RecordKind.STEP_END, payload=()) -> None:
    off = wire.RING_OFFSET + (rec_index % cap) * wire.RECORD_WORDS * wire.WORD
    words = [rec_index, kind, 1000 + rec_index, rec_index + 1, *payload]
    words += [0] * (wire.RECORD_WORDS - len(words))
    struct.pack_into(f"<{wire.RECORD_WORDS}q", buf, off, *words)


def write_file(tmp_path, buf, name="s.slot") -> str:
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(buf)
    return path


@settings(max_examples=60, deadline=None)
@given(
    job=TEXT,
    host=TEXT,
    run_id=TEXT,
    world=st.integers(1, 1 << 20),
    rank_frac=st.floats(0, 1, exclude_max=True),
    local_rank=st.integers(0, 1 << 16),
    pid=st.integers(1, 2**31),
    start_us=st.integers(0, 2**62),
    cap=st.integers(1, 64),
    wall=INT64,
    mono=INT64,
)
def test_init_then_decode_round_trips_identity(
    job, host, run_id, world, rank_frac, local_rank, pid, start_us, cap, wall, mono
):
    rank = int(rank_frac * world)
    ident = wire.Identity(job, host, rank, local_rank, world, pid, start_us, run_id)
    buf = bytearray(wire.slot_size(cap))
    wire.init_slot(buf, ident, cap, wall_ns=wall, mono_ns=mono)
    h = wire.decode_header(bytes(buf[: wire.RING_OFFSET]))
    assert h.identity == ident
    assert (h.version, h.ring_capacity, h.created_wall_ns, h.created_mono_ns) == (wire.VERSION, cap, wall, mono)
    assert h.status == wire.Status.STARTING
    assert h[wire.H_SEQ] == 0 and h[wire.H_RING_HEAD] == 0
    assert h[wire.H_STEP_START_NS] == mono and h.heartbeat_ns == mono


def test_long_identity_is_cut_on_a_character_boundary():
    job = "é" * 100  # 200 UTF-8 bytes; 127 would split the 64th character
    buf = fresh(job=job)
    h = wire.decode_header(bytes(buf[: wire.RING_OFFSET]))
    assert h.identity.job == "é" * 63


def test_init_slot_rejects_bad_capacity_and_short_buffer():
    with pytest.raises(ValueError, match="ring capacity"):
        wire.init_slot(bytearray(wire.slot_size(1)), identity(), 0, wall_ns=0, mono_ns=0)
    with pytest.raises(ValueError, match="needs"):
        wire.init_slot(bytearray(100), identity(), 4, wall_ns=0, mono_ns=0)


DYNAMIC = wire.H_LAST_DYNAMIC - wire.H_STEP + 1


@settings(max_examples=40, deadline=None)
@given(values=st.lists(INT64, min_size=DYNAMIC, max_size=DYNAMIC))
def test_dynamic_header_words_round_trip(tmp_path_factory, values):
    buf = fresh()
    values[wire.H_RING_HEAD - wire.H_STEP] = 0  # keep the rings empty: only the header is under test
    for i, v in zip(range(wire.H_STEP, wire.H_LAST_DYNAMIC + 1), values):
        set_word(buf, i, v)
    path = write_file(tmp_path_factory.mktemp("w"), buf)
    snap = wire.read_slot(path)
    assert not snap.torn
    got = snap.header.words[wire.H_STEP : wire.H_LAST_DYNAMIC + 1]
    assert list(got) == values


@settings(max_examples=60, deadline=None)
@given(value=st.floats(allow_nan=True, allow_infinity=True), step=st.integers(1, 2**40))
def test_loss_round_trips_through_its_words(tmp_path_factory, value, step):
    buf = fresh()
    for i, v in zip(wire.LOSS_WORDS, (wire.loss_bits(value), step, 0, 0)):
        set_word(buf, i, v)
    header = wire.read_slot(write_file(tmp_path_factory.mktemp("w"), buf)).header
    got = header.loss
    assert got is not None and (got == value or (got != got and value != value))
    assert header[wire.H_LOSS_STEP] == step


def test_a_slot_without_loss_words_reports_no_loss(tmp_path):
    """Slots from hooks older than the loss words have them zero: no loss, not a 0.0 loss."""
    header = wire.read_slot(write_file(tmp_path, fresh())).header
    assert header.version == wire.VERSION and header.loss is None
    assert wire.H_LAST_DYNAMIC < wire.H_HEARTBEAT_NS and all(
        wire.H_STEP <= w <= wire.H_LAST_DYNAMIC for w in wire.LOSS_WORDS
    )


def test_the_start_ticks_word_is_its_own_and_zero_in_older_slots(tmp_path):
    """Word 59 was zero in every slot before the hook wrote its start ticks there: an
    older hook's slot reads "not known", and no other header word shares it."""
    assert wire.read_slot(write_file(tmp_path, fresh())).header.identity.proc_start_ticks == 0
    others = {v for n, v in vars(wire).items() if n.startswith("H_") and n not in ("H_PROC_START_TICKS",)}
    assert wire.H_PROC_START_TICKS not in others and not wire.seqlocked(wire.H_PROC_START_TICKS)
    buf = fresh()
    set_word(buf, wire.H_PROC_START_TICKS, 123456)
    assert wire.read_slot(write_file(tmp_path, buf, "t.slot")).header.identity.proc_start_ticks == 123456


def test_progress_words_live_in_the_identitys_reserved_field_and_are_zero_in_older_slots(tmp_path):
    """The progress words (hook/progress.py) take the identity's fourth, reserved field:
    zero in a slot an older hook wrote (its reserved string is empty), outside the
    seqlock, and the identity an older reader decodes is unchanged by them."""
    assert wire.read_slot(write_file(tmp_path, fresh())).header.progress == (0,) * len(wire.PROGRESS_WORDS)
    assert wire.PROGRESS_OFFSET == wire.IDENTITY_OFFSET + 3 * wire.IDENTITY_FIELD_BYTES
    assert (wire.P_LAST + 1) * wire.WORD <= wire.RING_OFFSET and not any(map(wire.seqlocked, wire.PROGRESS_WORDS))
    buf = fresh()
    for i, w in enumerate(wire.PROGRESS_WORDS):
        set_word(buf, w, 1000 + i)
    header = wire.read_slot(write_file(tmp_path, buf, "p.slot")).header
    assert [header.progress_word(w) for w in wire.PROGRESS_WORDS] == [1000 + i for i in range(len(wire.PROGRESS_WORDS))]
    assert header.identity == wire.read_slot(write_file(tmp_path, fresh(), "q.slot")).header.identity


def test_records_round_trip_and_since(tmp_path):
    cap = 8
    buf = fresh(cap)
    for i in range(5):
        put_record(buf, cap, i, payload=(10 * i, 20 * i))
    set_word(buf, wire.H_RING_HEAD, 5)
    path = write_file(tmp_path, buf)
    recs = wire.read_slot(path).records
    assert [r.index for r in recs] == [0, 1, 2, 3, 4]
    assert recs[3].payload[:2] == (30, 60) and recs[3].step == 4 and recs[3].t_ns == 1003
    assert recs[3].to_words()[:6] == [3, wire.RecordKind.STEP_END, 1003, 4, 30, 60]
    assert [r.index for r in wire.read_slot(path, since=3).records] == [3, 4]
    assert wire.read_slot(path, since=5).records == ()


def test_ring_wrap_keeps_only_the_newest_capacity_records(tmp_path):
    cap = 4
    buf = fresh(cap)
    for i in range(11):
        put_record(buf, cap, i)
    set_word(buf, wire.H_RING_HEAD, 11)
    recs = wire.read_slot(write_file(tmp_path, buf)).records
    assert [r.index for r in recs] == [7, 8, 9, 10]


def test_a_record_whose_index_does_not_match_its_place_is_dropped(tmp_path):
    cap = 4
    buf = fresh(cap)
    for i in range(4):
        put_record(buf, cap, i)
    put_record(buf, cap, 6)  # lands on place 2, where index 2 was expected
    set_word(buf, wire.H_RING_HEAD, 4)
    recs = wire.read_slot(write_file(tmp_path, buf)).records
    assert [r.index for r in recs] == [0, 1, 3]


def test_records_the_writer_overtakes_during_the_read_are_dropped(tmp_path, monkeypatch):
    """The writer appends two records between our header read and our ring read;
    their places held the two oldest records we were about to report."""
    cap = 4
    buf = fresh(cap)
    for i in range(6):
        put_record(buf, cap, i)
    set_word(buf, wire.H_RING_HEAD, 6)
    path = write_file(tmp_path, buf)
    real_pread = os.pread
    ring_read = []

    def pread(fd, n, off):
        if off == wire.RING_OFFSET:
            ring_read.append(True)
        elif ring_read and off == wire.H_SEQ * wire.WORD:  # the check after the ring copy
            raw = bytearray(real_pread(fd, n, off))
            struct.pack_into("<q", raw, 0, 4)  # two brackets later
            struct.pack_into("<q", raw, (wire.H_RING_HEAD - wire.H_SEQ) * wire.WORD, 8)
            return bytes(raw)
        return real_pread(fd, n, off)

    monkeypatch.setattr(wire.os, "pread", pread)
    recs = wire.read_slot(path).records
    # 2..5 were in the ring; 2 and 3 share places with 6 and 7, being written now.
    assert [r.index for r in recs] == [4, 5]


def test_a_writer_stopped_mid_bracket_costs_the_oldest_record_only(tmp_path):
    cap = 4
    buf = fresh(cap)
    for i in range(6):
        put_record(buf, cap, i)
    set_word(buf, wire.H_RING_HEAD, 6)
    set_word(buf, wire.H_SEQ, 9)  # stopped inside a bracket: maybe writing record 6 over 2
    snap = wire.read_slot(write_file(tmp_path, buf))
    assert snap.torn and [r.index for r in snap.records] == [3, 4, 5]


def test_odd_seq_is_reported_torn_not_dropped(tmp_path):
    buf = fresh()
    set_word(buf, wire.H_STEP, 42)
    set_word(buf, wire.H_SEQ, 7)  # a writer stopped inside its bracket
    snap = wire.read_slot(write_file(tmp_path, buf))
    assert snap.torn is True
    assert snap.header[wire.H_STEP] == 42


def test_even_seq_is_consistent(tmp_path):
    buf = fresh()
    set_word(buf, wire.H_SEQ, 8)
    assert wire.read_slot(write_file(tmp_path, buf)).torn is False


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda b: set_word(b, wire.H_MAGIC, 0), wire.CorruptSlot),
        (lambda b: set_word(b, wire.H_VERSION, wire.VERSION + 1), wire.UnsupportedVersion),
        (lambda b: set_word(b, wire.H_RING_CAPACITY, 0), wire.CorruptSlot),
        (lambda b: set_word(b, wire.H_RING_CAPACITY, wire.MAX_RING_CAPACITY + 1), wire.CorruptSlot),
        (lambda b: set_word(b, wire.H_RECORD_WORDS, 8), wire.CorruptSlot),
        (lambda b: set_word(b, wire.H_RANK, 5), wire.CorruptSlot),  # rank >= world size 1
        (lambda b: set_word(b, wire.H_PID, 0), wire.CorruptSlot),
        (lambda b: set_word(b, wire.H_PROC_START_TICKS, -1), wire.CorruptSlot),
    ],
)
def test_bad_headers_raise_the_right_slot_error(tmp_path, mutate, error):
    buf = fresh()
    mutate(buf)
    with pytest.raises(error) as info:
        wire.read_slot(write_file(tmp_path, buf))
    assert isinstance(info.value, wire.SlotError)
    assert info.value.reason == error.reason


def test_short_file_is_corrupt(tmp_path):
    buf = fresh()
    with pytest.raises(wire.CorruptSlot, match="shorter"):
        wire.read_slot(write_file(tmp_path, buf[:300]))


@pytest.mark.parametrize("head, expected", [(8, [0, 1, 2]), (10, [2, 8, 9])])
def test_file_cut_inside_the_ring_returns_what_is_there(tmp_path, head, expected):
    cap = 8
    buf = fresh(cap)
    for i in range(head):
        put_record(buf, cap, i)
    set_word(buf, wire.H_RING_HEAD, head)
    cut = wire.RING_OFFSET + 3 * wire.RECORD_WORDS * wire.WORD  # places 0, 1, 2 survive
    recs = wire.read_slot(write_file(tmp_path, buf[:cut])).records
    assert [r.index for r in recs] == expected


@settings(max_examples=30, deadline=None)
@given(seq=INT64, arg=INT64, cmd=st.sampled_from(list(wire.Command)))
def test_write_control_round_trip(tmp_path_factory, seq, arg, cmd):
    path = write_file(tmp_path_factory.mktemp("c"), fresh())
    wire.write_control(path, seq, cmd, arg)
    h = wire.read_slot(path).header
    assert (h[wire.H_CTRL_SEQ], h[wire.H_CTRL_CMD], h[wire.H_CTRL_ARG]) == (seq, cmd, arg)


def test_group_key_default_group_is_zero_and_names_are_stable():
    assert wire.group_key("") == wire.group_key("0") == 0
    assert wire.group_key("1") == wire.group_key("1") != 0
    assert wire.group_key("1") != wire.group_key("2")


def test_slot_filename_is_safe():
    name = wire.slot_filename("../etc/passwd job", 3, 42)
    assert "/" not in name and name.endswith(".rank3.pid42.slot")


def test_list_slot_files(tmp_path):
    (tmp_path / "a.rank0.pid1.slot").write_bytes(b"")
    (tmp_path / "other.txt").write_bytes(b"")
    assert wire.list_slot_files(str(tmp_path)) == [str(tmp_path / "a.rank0.pid1.slot")]
    assert list(wire.list_slot_files(str(tmp_path / "missing"))) == []


def put_event(buf, cap: int, index: int, kind: int = wire.RecordKind.COMPLETION, payload=()) -> None:
    ev_cap = wire.EVENT_RING_FACTOR * cap
    off = wire.event_ring_offset(cap) + (index % ev_cap) * wire.RECORD_WORDS * wire.WORD
    words = [index, kind, 5000 + index, 7, *payload]
    struct.pack_into(f"<{wire.RECORD_WORDS}q", buf, off, *(words + [0] * (wire.RECORD_WORDS - len(words))))


def test_a_burst_of_collective_events_leaves_the_step_records_readable(tmp_path):
    """A DDP/FSDP burst writes a record or two per collective: in their own ring,
    hundreds of them never push out the steps the agent has not read yet."""
    cap = 4
    buf = fresh(cap)
    for i in range(3):
        put_record(buf, cap, i)
    set_word(buf, wire.H_RING_HEAD, 3)
    for i in range(40):  # 2.5 times around the event ring
        put_event(buf, cap, i, payload=(1, 0, i + 1))
    set_word(buf, wire.H_EVENT_RING_HEAD, 40)
    path = write_file(tmp_path, buf)
    snap = wire.read_slot(path)
    assert [r.index for r in snap.records] == [0, 1, 2]
    assert [r.index for r in snap.events] == list(range(40 - 4 * cap, 40))
    assert all(r.kind == wire.RecordKind.COMPLETION for r in snap.events)
    # Each ring has its own "since": reading new steps does not re-read old events.
    again = wire.read_slot(path, since=3, events_since=38)
    assert again.records == () and [r.index for r in again.events] == [38, 39]


def test_a_version_1_slot_from_an_older_hook_is_still_read(tmp_path):
    """One ring holding every kind, no event-ring words: read as before."""
    cap = 8
    buf = bytearray(wire.event_ring_offset(cap))  # the version-1 size
    full = bytearray(wire.slot_size(cap))
    wire.init_slot(full, identity(), cap, wall_ns=1, mono_ns=2)
    buf[:] = full[: len(buf)]
    for w in (wire.H_EVENT_RING_OFFSET, wire.H_EVENT_RING_CAPACITY):
        set_word(buf, w, 0)
    set_word(buf, wire.H_VERSION, 1)
    put_record(buf, cap, 0)
    put_record(buf, cap, 1, kind=wire.RecordKind.COLL_SIG, payload=(0, 1))
    set_word(buf, wire.H_RING_HEAD, 2)
    snap = wire.read_slot(write_file(tmp_path, buf))
    assert snap.header.version == 1 and snap.header.event_ring_capacity == 0 and snap.events == ()
    assert [r.kind for r in snap.records] == [wire.RecordKind.STEP_END, wire.RecordKind.COLL_SIG]


@pytest.mark.parametrize(
    "word, value",
    [
        (wire.H_EVENT_RING_OFFSET, 64),  # pointing into the header
        (wire.H_EVENT_RING_OFFSET, 1 << 40),  # far past the file
        (wire.H_EVENT_RING_CAPACITY, 1 << 30),  # a huge read
        (wire.H_EVENT_RING_CAPACITY, 0),
        (wire.H_EVENT_RING_HEAD, -5),
    ],
)
def test_a_forged_event_ring_layout_is_rejected_as_corrupt(tmp_path, word, value):
    buf = fresh(8)
    set_word(buf, word, value)
    with pytest.raises(wire.CorruptSlot):
        wire.read_slot(write_file(tmp_path, buf))


def test_an_unknown_version_is_rejected(tmp_path):
    buf = fresh(8)
    set_word(buf, wire.H_VERSION, 3)
    with pytest.raises(wire.UnsupportedVersion):
        wire.read_slot(write_file(tmp_path, buf))


def test_the_frame_words_are_the_progress_areas_last_eight_and_none_in_older_slots(tmp_path):
    """The frame (hook/frames.py) fills the progress area's other 8 words: zero in an
    older hook's slot (no frame), outside the seqlock, below the ring."""
    assert wire.read_slot(write_file(tmp_path, fresh())).header.frame is None
    assert (
        wire.P_FRAME_STEP == wire.P_LAST + 1 and (wire.P_FRAME_STEP + wire.FRAME_WORDS) * wire.WORD == wire.RING_OFFSET
    )
    assert not any(map(wire.seqlocked, range(wire.P_FRAME_STEP, wire.P_FRAME_STEP + wire.FRAME_WORDS)))
    buf = fresh()
    for i, w in enumerate(wire.encode_frame(41, 123_456, "estimate_loss (train.py:41)")):
        set_word(buf, wire.P_FRAME_STEP + i, w)
    header = wire.read_slot(write_file(tmp_path, buf, "f.slot")).header
    assert header.frame == (41, 123_456, "estimate_loss (train.py:41)")
    assert header.progress == (0,) * len(wire.PROGRESS_WORDS)  # its own words


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("upload_metrics (fixture.py:21)", "upload_metrics (fixture.py:21)"),
        ("f" * 60, "f" * wire.FRAME_TEXT_BYTES),  # cut to the field
        ("é" * 30, "é" * (wire.FRAME_TEXT_BYTES // 2)),  # never inside a character
        ("", ""),
    ],
)
def test_a_frame_round_trips_through_its_words(text, want):
    assert wire.decode_frame(wire.encode_frame(7, 1, text)) == (7, 1, want)


def test_a_frame_copy_torn_by_a_write_reads_as_none():
    """The hook writes the 8 words one by one while the agent may copy them: a copy
    with the old step and part of the new text fails its CRC instead of pairing them."""
    old, new = wire.encode_frame(40, 5, "estimate_loss (train.py:41)"), wire.encode_frame(60, 9, "save (train.py:80)")
    for cut in range(1, wire.FRAME_WORDS):
        mixed = new[:cut] + old[cut:]
        assert wire.decode_frame(mixed) is None, cut
    assert wire.decode_frame((0,) * wire.FRAME_WORDS) is None


def test_watchdog_wire_re_exports_every_public_name_of_the_slot_contract():
    # watchdog.wire is public API (README); its home is watchdog.contracts.slot
    import ast
    import inspect

    import watchdog.wire as public

    tree = ast.parse(inspect.getsource(wire))
    defined = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                defined |= {e.id for e in elts if isinstance(e, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    assert sorted(public.__all__) == sorted(n for n in defined if not n.startswith("_"))
    assert all(getattr(public, n) is getattr(wire, n) for n in public.__all__)
