"""What lives in Redis: the leader lease and its fencing epoch (``holder``), the
lease as operators read it (``status``), the beat processes' presence
(``presence``), and each process's crash-detection beacon, whose halves are a
PostgreSQL session and a Redis connection (``beacon``).

A fast path acts only on proof: a beacon's halves count as gone only on the
server they were opened on, both at one moment; everything else falls back to
the leases and the database's clock."""
