"""The byte layout of a channel's segment (torch-free, so the command line can size /dev/shm).

    header   HEADER bytes: magic, slots, slot bytes, sender pid, entries; sem_t at SPACE, DATA,
             ACKS and BUFS
    entry k  ENTRY_BYTES: one message piece's (tag, message bytes, payload bytes, shared offset)
    slot j   SLOT_BYTES of payload
"""

from __future__ import annotations

MAGIC = 0x335F4D48535A52    # "RZSHM_3"
HEADER = 512
SPACE, DATA, ACKS, BUFS = 64, 128, 192, 256
"""Byte offsets of the semaphores: `space` (free entries), `data` (written entries), `acks`
(messages read in place out of the sender's shared tensor, `shared`) and `bufs` (free slots)."""
ENTRIES = 64
"""Entries per direction: a message cut from a shared tensor takes an entry and no slot, so up to
64 such messages are in flight without the sender ever waiting."""
ENTRY_BYTES = 64
REF = -1
"""An entry whose payload bytes are `REF - region` has no slot: its message is left in the
sender's shared tensor `region` (`shared`), at the offset the entry's fourth word gives."""
SLOT_BYTES = 1 << 20
"""Payload per slot: one ring segment (`plan.comm.chunks.SEGMENT_BYTES`), so a segment costs one
hand-off of Python work on each side."""
SLOTS = 4
"""Slots per direction: 4 MiB of copied messages in flight between two ranks."""


def segment_bytes(slots: int = SLOTS, slot_bytes: int = SLOT_BYTES, entries: int = ENTRIES) -> int:
    """Bytes of one channel's segment."""
    return HEADER + entries * ENTRY_BYTES + slots * slot_bytes


def channels_bytes(group_sizes) -> int:
    """/dev/shm bytes the channels of groups of these sizes can take at most: one segment per
    ordered pair of each group (each is made when the pair first talks)."""
    return sum(k * (k - 1) for k in group_sizes) * segment_bytes()
