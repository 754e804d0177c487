"""The byte layout of a channel's segment (torch-free, so the command line can size /dev/shm).

    header  HEADER bytes: magic, slots, slot bytes, sender pid; sem_t at SPACE, DATA and ACKS
    slot k  SLOT_HEADER bytes (tag, message bytes, payload bytes, shared offset), then SLOT_BYTES
            of payload
"""

from __future__ import annotations

MAGIC = 0x325F4D48535A52    # "RZSHM_2"
HEADER = 256
SPACE, DATA, ACKS = 64, 128, 192
"""Byte offsets of the `space` (free slots), `data` (filled slots) and `acks` (messages read in
place out of the sender's shared tensor, `shared`) semaphores."""
SLOT_HEADER = 64
REF = -1
"""A slot whose payload bytes are `REF - region` holds no payload: its message is left in the sender's
shared tensor `region` (`shared`), at the offset the slot header's fourth word gives."""
SLOT_BYTES = 1 << 20
"""Payload per slot: one ring segment (`plan.comm.chunks.SEGMENT_BYTES`), so a segment costs one
hand-off of Python work on each side."""
SLOTS = 4
"""Slots per direction: 4 MiB in flight between two ranks."""


def segment_bytes(slots: int = SLOTS, slot_bytes: int = SLOT_BYTES) -> int:
    """Bytes of one channel's segment."""
    return HEADER + slots * (SLOT_HEADER + slot_bytes)


def channels_bytes(group_sizes) -> int:
    """/dev/shm bytes the channels of groups of these sizes can take at most: one segment per
    ordered pair of each group (each is made when the pair first talks)."""
    return sum(k * (k - 1) for k in group_sizes) * segment_bytes()
