"""The summary of finished runs also by block of ten minutes (``beat_run_blocks``), kept
by triggers on ``beat_run_minutes``: a plot of all schedules over days sums a block where
ten minutes lie in one of its buckets, a tenth of the rows.

A statement that inserts minutes adds them to their blocks; one that deletes or updates
minutes (retention) marks their blocks ``broken``, for good: a broken block's minutes
are read one by one, also those written after (a block retention cut and the summariser
then filled holds only the later minutes). A truncation empties the blocks. Triggers
rather than the summariser's code: every writer of minutes keeps the blocks right, a
summariser of the release before included. The blocks of the minutes already
summarised are made here.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

# Written out: a migration keeps the states of its time.
STATES = (
    "state IN ('pending', 'queued', 'running', 'succeeded', 'failed', 'retrying', 'lost',"
    " 'skipped', 'cancelled', 'expired')"
)
# The block of a minute: ten minutes from the epoch on, whatever the session's time zone.
BLOCK_OF_MINUTE = "to_timestamp(floor(date_part('epoch', {0}.minute) / 600) * 600)"

# The minutes of ``{source}`` added to their blocks: counts summed, histograms summed
# bin by bin (NULL where no run of the block was published), the slowest kept.
ADD_TO_BLOCKS = """
WITH cells AS (
    SELECT {block} AS block, source.state, cell.bin, sum(cell.runs) AS runs
    FROM {source} AS source
    CROSS JOIN LATERAL unnest(source.lateness_bins) WITH ORDINALITY AS cell(runs, bin)
    GROUP BY 1, 2, 3
), histograms AS (
    SELECT block, state, array_agg(runs ORDER BY bin)::integer[] AS bins
    FROM cells GROUP BY 1, 2
), totals AS (
    SELECT {block} AS block, source.state, sum(source.runs) AS runs,
        sum(source.published) AS published, max(source.lateness_max) AS lateness_max,
        sum(source.lateness_sum) AS lateness_sum
    FROM {source} AS source GROUP BY 1, 2
)
INSERT INTO beat_run_blocks AS kept
    (block, state, runs, published, lateness_bins, lateness_max, lateness_sum)
SELECT totals.block, totals.state, totals.runs, totals.published, histograms.bins,
    totals.lateness_max, totals.lateness_sum
FROM totals LEFT JOIN histograms USING (block, state)
ON CONFLICT (block, state) DO UPDATE SET
    runs = kept.runs + excluded.runs,
    published = kept.published + excluded.published,
    lateness_bins = (
        SELECT array_agg(coalesce(mine, 0) + coalesce(theirs, 0) ORDER BY bin)::integer[]
        FROM unnest(kept.lateness_bins, excluded.lateness_bins)
            WITH ORDINALITY AS cell(mine, theirs, bin)
    ),
    lateness_max = greatest(kept.lateness_max, excluded.lateness_max),
    lateness_sum = (
        SELECT sum(total) FROM (VALUES (kept.lateness_sum), (excluded.lateness_sum)) AS t(total)
    )
""".replace("{block}", BLOCK_OF_MINUTE.format("source"))

# The blocks of the minutes ``{changed}`` selects marked broken (made so if absent: a
# block filled after is broken all the same). Never cleared: an insert adds to a broken
# block as to any, and the plots read its minutes instead.
BREAK_BLOCKS = """
INSERT INTO beat_run_blocks AS kept (block, state, runs, published, broken)
SELECT DISTINCT {block}, changed.state, 0, 0, true FROM ({changed}) AS changed
ON CONFLICT (block, state) DO UPDATE SET broken = true
""".replace("{block}", BLOCK_OF_MINUTE.format("changed"))

REMOVED = "SELECT minute, state FROM removed"
REMOVED_AND_ADDED = f"{REMOVED} UNION ALL SELECT minute, state FROM added"

TRIGGERS = f"""
CREATE FUNCTION beat_run_blocks_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {ADD_TO_BLOCKS.format(source="added")};
    RETURN NULL;
END
$$;
CREATE FUNCTION beat_run_blocks_break() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {BREAK_BLOCKS.format(changed=REMOVED)};
    RETURN NULL;
END
$$;
CREATE FUNCTION beat_run_blocks_break_both() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    {BREAK_BLOCKS.format(changed=REMOVED_AND_ADDED)};
    RETURN NULL;
END
$$;
CREATE FUNCTION beat_run_blocks_clear() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Not TRUNCATE: that refuses a table the statement truncating the minutes also names.
    DELETE FROM beat_run_blocks;
    RETURN NULL;
END
$$;
CREATE TRIGGER beat_run_minutes_add_blocks AFTER INSERT ON beat_run_minutes
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION beat_run_blocks_add();
CREATE TRIGGER beat_run_minutes_break_blocks AFTER DELETE ON beat_run_minutes
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION beat_run_blocks_break();
CREATE TRIGGER beat_run_minutes_break_changed_blocks AFTER UPDATE ON beat_run_minutes
    REFERENCING OLD TABLE AS removed NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION beat_run_blocks_break_both();
CREATE TRIGGER beat_run_minutes_clear_blocks AFTER TRUNCATE ON beat_run_minutes
    FOR EACH STATEMENT EXECUTE FUNCTION beat_run_blocks_clear();
"""


def upgrade() -> None:
    op.create_table(
        "beat_run_blocks",
        sa.Column("block", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("state", sa.Text(), primary_key=True),
        sa.Column("runs", sa.BigInteger(), nullable=False),
        sa.Column("published", sa.BigInteger(), nullable=False),
        sa.Column("lateness_bins", postgresql.ARRAY(sa.Integer())),
        sa.Column("lateness_max", sa.Double()),
        sa.Column("lateness_sum", sa.Double()),
        sa.Column("broken", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.CheckConstraint(STATES, name="ck_beat_run_blocks_state"),
    )
    # The summariser's row lock: no minute is summarised while the blocks are made.
    op.execute("SELECT 1 FROM beat_run_summary FOR UPDATE")
    op.execute(TRIGGERS)
    op.execute(ADD_TO_BLOCKS.format(source="beat_run_minutes"))


def downgrade() -> None:
    for trigger in ("add_blocks", "break_blocks", "break_changed_blocks", "clear_blocks"):
        op.execute(f"DROP TRIGGER beat_run_minutes_{trigger} ON beat_run_minutes")
    for function in ("add", "break", "break_both", "clear"):
        op.execute(f"DROP FUNCTION beat_run_blocks_{function}()")
    op.drop_table("beat_run_blocks")
