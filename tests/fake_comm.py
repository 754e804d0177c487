"""Shared pieces of the in-process fake Comms that run algorithms on threads."""


class PostByExchange:
    """`post_send`/`post_recv`/`post_recv_reduce` of the Comm interface, as one-message `exchange`
    calls (the last into its scratch, reduced into its destination when waited for)."""

    def post_send(self, peer, buf, new_round=False):
        return self.exchange([(peer, buf)], (), new_round)

    def post_recv(self, peer, buf, new_round=False):
        return self.exchange((), [(peer, buf)], new_round)

    def post_recv_reduce(self, peer, dst, scratch, new_round=False):
        return _ThenReduce(self.exchange((), [(peer, scratch)], new_round), self, dst, scratch)


class _ThenReduce:
    def __init__(self, handle, comm, dst, scratch):
        self.handle, self.comm, self.dst, self.scratch = handle, comm, dst, scratch

    def wait(self):
        self.handle.wait()
        self.comm.reduce(self.dst, self.scratch)
