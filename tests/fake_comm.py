"""Shared pieces of the in-process fake Comms that run algorithms on threads."""


class PostByExchange:
    """`post_send`/`post_recv` of the Comm interface, as one-message `exchange` calls."""

    def post_send(self, peer, buf, new_round=False):
        return self.exchange([(peer, buf)], (), new_round)

    def post_recv(self, peer, buf, new_round=False):
        return self.exchange((), [(peer, buf)], new_round)
