"""The PostgreSQL store's statements, by name: a scheduler round's, the worker's claim and
finish, the relay's claim.

Each takes its rows as arrays, one JSON parameter or one COPY, so a round is the same handful
of statements whether it carries ten tasks or ten thousand. The statements that write new job
rows take their columns from ``columns.NEW_JOB_COLUMNS``. ``portable.py`` does the same
through the ORM.
"""

from __future__ import annotations

from ..db import Named
from ..models import CheckIn, Job, Occurrence, Task
from .columns import CARRIED, CLAIMED_COLUMNS, NEW_JOB_COLUMNS, NEW_JOB_NAMES

_TASK = Task._meta.db_table
_JOB = Job._meta.db_table
_OCCURRENCE = Occurrence._meta.db_table
_CHECK_IN = CheckIn._meta.db_table

#: Whether each of the two tables named (``portable.APP_TABLES``) is missing from the search
#: path.
MISSING_TABLES = "SELECT to_regclass(%s) IS NULL, to_regclass(%s) IS NULL"

#: Every task's watermark (as whole microseconds since the epoch) and pause, in no order. An
#: integer, not a timestamptz: Django's timestamptz loader runs in Python for every row, an
#: integer loads in C. Exact: extract() returns numeric from PostgreSQL 14 on, the oldest
#: Django 5.2 supports.
TASK_STATES = f"""
SELECT name, (extract(epoch FROM last_fired_at) * 1000000)::bigint, paused FROM {_TASK}
"""

#: Every task's declaration as last mirrored, then its state as ``TASK_STATES`` reads it;
#: ``has_jobs`` stands in for the list itself.
TASK_DECLARATIONS = f"""
SELECT name, cron, tz, catch_up, max_catch_up, overlap, declared, jobs <> '[]'::jsonb AS has_jobs,
       (extract(epoch FROM last_fired_at) * 1000000)::bigint, paused
FROM {_TASK}
"""

#: The columns a new task's row is written with, by ``COPY_TASKS`` and ``INSERT_TASKS``.
_NEW_TASK = """name, cron, tz, catch_up, max_catch_up, overlap, jobs, paused, paused_note,
paused_by, declared, first_seen_at, synced_at"""

#: Rows for newly declared tasks, each as ``_NEW_TASK`` lists its columns. In text, not
#: binary: the table refuses a ``max_catch_up`` past its column, where binary would wrap it.
COPY_TASKS = f"COPY {_TASK} ({_NEW_TASK}) FROM STDIN"

#: The instant ``INSERT_TASKS`` writes as ``now()``, for rows COPY writes in the same
#: transaction.
TRANSACTION_NOW = "SELECT now()"

#: The same from JSON, where a name another node just inserted is left alone.
INSERT_TASKS = f"""
INSERT INTO {_TASK} ({_NEW_TASK})
SELECT v.name, v.cron, v.tz, v.catch_up, v.max_catch_up, v.overlap, v.jobs, false, '', '', true,
       now(), now()
FROM json_to_recordset(%s::json) AS v(
    name text, cron text, tz text, catch_up text, max_catch_up integer, overlap text, jobs jsonb)
ON CONFLICT (name) DO NOTHING
"""

#: Compare-and-set every watermark of a round in one statement: a row moves only while it still
#: holds the watermark the round planned from (re-checked after any concurrent update), and the
#: count returned says whether every row did. Run after the fence, inside the round's
#: transaction. The rows come as one JSON array of ``[names, expected, watermark]``, the tasks
#: of one pair of instants together: tasks of one schedule move alike, and each pair is then
#: read and cast once, not once a task. psycopg builds arrays in Python, and rows as objects
#: repeat their keys in every row. As jsonb, parsed once: ``->>`` on json scans the element's
#: text at each of its reads. The names are spread out in a subquery kept apart (``OFFSET
#: 0``): pulled up into the join, a pair's cast ran again wherever its column is used, and a
#: join spilling to disk wrote the whole list of names out again with every row. A count
#: rather than the names: the names would be read back, a tuple and a string a row, for
#: nothing. Beside it, under the same locks, the tasks a backfill enqueued occurrences of past
#: the expected watermark (``Task.backfilled_to``), with that instant as microseconds since
#: the epoch: almost always none.
SWAP_WATERMARKS = f"""
WITH swapped AS (
    UPDATE {_TASK} AS t SET last_fired_at = v.watermark
    FROM (SELECT n.name, g.expected, g.watermark
          FROM (SELECT e->0 AS names, (e->>1)::timestamptz AS expected,
                       (e->>2)::timestamptz AS watermark
                FROM jsonb_array_elements(%s::jsonb) AS e OFFSET 0) AS g,
               jsonb_array_elements_text(g.names) AS n(name) OFFSET 0) AS v
    WHERE t.name = v.name AND t.last_fired_at IS NOT DISTINCT FROM v.expected
    RETURNING t.name, t.backfilled_to, v.expected
)
SELECT count(*),
       array_agg(name) FILTER (WHERE backfilled_to > expected),
       array_agg((extract(epoch FROM backfilled_to) * 1000000)::bigint)
           FILTER (WHERE backfilled_to > expected)
FROM swapped
"""

#: After a ``SWAP_WATERMARKS`` that did not move every row, in its transaction: a task of its
#: rows that does not hold the new watermark, to name in the log.
UNSWAPPED_WATERMARK = f"""
SELECT n.name
FROM jsonb_array_elements(%s::jsonb) AS e, jsonb_array_elements_text(e->0) AS n(name)
WHERE NOT EXISTS (
    SELECT FROM {_TASK} AS t
    WHERE t.name = n.name AND t.last_fired_at IS NOT DISTINCT FROM (e->>2)::timestamptz
)
LIMIT 1
"""

#: One task's row, locked until the transaction ends as ``SWAP_WATERMARKS`` locks it: a
#: backfill and a round of that task write one after the other.
LOCK_TASK = f"""
SELECT last_fired_at, paused, backfilled_to FROM {_TASK} WHERE name = %s FOR UPDATE
"""

#: What tasks declare now, written on their rows in one statement (a sync's changed tasks):
#: a join on the name, whatever their number. ``rearm`` clears the watermark.
UPDATE_DECLARATIONS = f"""
UPDATE {_TASK} AS t
SET cron = v.cron, tz = v.tz, catch_up = v.catch_up, max_catch_up = v.max_catch_up,
    overlap = v.overlap, jobs = v.jobs, declared = TRUE,
    last_fired_at = CASE WHEN v.rearm THEN NULL ELSE t.last_fired_at END
FROM jsonb_to_recordset(%s::jsonb) AS v(name text, cron text, tz text, catch_up text,
                                         max_catch_up integer, overlap text, jobs jsonb,
                                         rearm boolean)
WHERE t.name = v.name
"""

#: Watermarks set without a comparison, on rows the round's compare-and-set has locked.
SET_WATERMARKS = f"""
UPDATE {_TASK} AS t SET last_fired_at = v.watermark
FROM json_to_recordset(%s::json) AS v(name text, watermark timestamptz)
WHERE t.name = v.name
"""

#: Ids for a round's new jobs, taken from the table's own sequence, so COPY can write them.
#: The sequence is looked up once, in a subquery: called in ``nextval``'s argument it is
#: looked up again for every id.
RESERVE_JOB_IDS = f"""
SELECT nextval((SELECT pg_get_serial_sequence('{_JOB}', 'id')::regclass))
FROM generate_series(1, %s)
"""

_NEW_JOB = ", ".join(NEW_JOB_NAMES)
#: A round's jobs in one binary COPY, with their ids: no key may exist yet (else
#: ``INSERT_JOBS``). Binary: PostgreSQL parses no text for a row's three instants.
COPY_JOBS = f"COPY {_JOB} (id, {_NEW_JOB}) FROM STDIN (FORMAT BINARY)"
#: ``COPY_JOBS``' column types, in its order (``db.copy_rows``).
COPY_JOBS_TYPES = ("bigint", *(column.type for column in NEW_JOB_COLUMNS))
# What INSERT_JOBS writes to each column from its JSON row ``r``.
_FROM_JSON = ", ".join(
    column.new
    or (f"COALESCE(r.{column.name}, {column.default})" if column.default else f"r.{column.name}")
    for column in NEW_JOB_COLUMNS
)
_JSON_ROW = ", ".join(f"{column.name} {column.type}" for column in CARRIED)
# What INSERT_TASK writes to each column from its named parameters.
_FROM_PARAMS = ", ".join(
    column.new or (f"%({column.name})s::jsonb" if column.type == "jsonb" else f"%({column.name})s")
    for column in NEW_JOB_COLUMNS
)

#: Insert jobs from a JSON array of ``columns.job_fields`` rows; existing keys are left alone.
#: Returns the created ones.
INSERT_JOBS = f"""
INSERT INTO {_JOB} ({_NEW_JOB})
SELECT {_FROM_JSON}
FROM jsonb_to_recordset(%s::jsonb) AS r({_JSON_ROW})
ON CONFLICT (key) DO NOTHING
RETURNING key, id
"""

#: One Django Task's row (``columns.job_fields`` by name, and ``args``) and the NOTIFY that
#: wakes a worker for its queue: one round trip, where an ORM insert and a notify take two. A
#: NOTIFY in a transaction is sent at commit.
INSERT_TASK = f"""
WITH job AS (
    INSERT INTO {_JOB} ({_NEW_JOB}, args)
    VALUES ({_FROM_PARAMS}, %(args)s::jsonb)
    RETURNING id, queue
)
SELECT job.id, pg_notify(%(channel)s, job.queue) FROM job
"""

#: One NOTIFY on the channel per payload of the array, in its order: the workers of a round's
#: queues (or the relays) are woken by one statement, however many queues it wrote to.
NOTIFY = "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload"

#: Ids of jobs whose keys already existed.
EXISTING_JOBS = f"SELECT key, id FROM {_JOB} WHERE key = ANY(%s)"

#: Per task of the array, the earliest occurrence that still has a job queued or running.
BUSY_OCCURRENCES = f"""
SELECT task, MIN(occurrence) FROM {_JOB}
WHERE task = ANY(%s) AND status IN ('queued', 'running', 'outbox', 'relayed')
  AND occurrence IS NOT NULL
GROUP BY task
"""

#: Occurrence records in one binary COPY; rows in this column order.
COPY_OCCURRENCES = f"""
COPY {_OCCURRENCE} (task, outcome, occurrence, last_occurrence, count, catch_up, jobs,
                    recorded_at, node, "user", detail) FROM STDIN (FORMAT BINARY)
"""
#: ``COPY_OCCURRENCES``' column types, in its order.
COPY_OCCURRENCES_TYPES = (
    "text", "text", "timestamptz", "timestamptz", "integer", "boolean", "jsonb", "timestamptz",
    "text", "text", "text",
)  # fmt: skip

# What a claim returns: ``CLAIMED_COLUMNS``, then started_at (NULL unless the claim marked the
# row started); instants as microseconds since the epoch (see ``db.instants_from_microseconds``).
# An instant Python cannot hold (written around the app: infinite, before year 1 or after 9999
# in UTC) is NULL, never a cast the server refuses past year 294,000: that would fail every
# claim, the rows behind it stuck.
_RETURNING = ", ".join(
    [
        f"CASE WHEN job.{column} >= '0001-01-01 00:00+00' "
        f"AND job.{column} < '10000-01-01 00:00+00' "
        f"THEN (extract(epoch FROM job.{column}) * 1000000)::bigint END"
        if column in ("run_at", "created_at", "started_at")
        else f"job.{column}"
        for column in (*CLAIMED_COLUMNS, "started_at")
    ]
)

# Claim up to %(limit)s due jobs in one statement. SKIP LOCKED lets workers claim side by side
# without waiting on each other's rows, and a row locked by one is never returned to another.
# The attempt is counted here, at claim time. The first %(start)s rows in claim order go
# straight to idle threads and are marked started by the claim itself; the rest are claimed
# ahead, ``started_at`` NULL, until a thread takes one (``MARK_STARTED``). Only a started
# attempt stays counted when its worker dies, so a job that kills its worker still uses one up
# and the jobs claimed beside it do not.
#
# Claim order is priority (highest first), then the longest due, then id. The due rows are
# walked one priority at a time (``levels``: the priorities queued rows hold, each found by one
# descent of the index), so ``run_at <= now`` ends each walk at the first row not due yet. In
# one walk of the index, whose first column is the priority, that bound ended nothing: behind
# 1,000,000 jobs due tomorrow a claim read them all, 13 to 25 ms, even with nothing due. The
# walks come highest priority first, each in order, and the claim stops at its limit: rows it
# does not take are never locked. ``{queued}`` matches the partial index's predicate, so finished
# history is never scanned.
_BY_PRIORITY = """
    WITH RECURSIVE levels(priority) AS (
        SELECT max(priority) FROM {table} WHERE {queued}
        UNION ALL
        SELECT (SELECT max(priority) FROM {table} WHERE {queued} AND priority < levels.priority)
        FROM levels WHERE levels.priority IS NOT NULL
    )
    SELECT walk.id, walk.priority, walk.run_at FROM levels, LATERAL (
        SELECT id, priority, run_at FROM {table}
        WHERE {queued} AND priority = levels.priority AND run_at <= %(now)s
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS walk
    LIMIT %(limit)s
"""
# Every queue's: by the ready index (u3j_job_ready).
_DUE = _BY_PRIORITY.format(table="{table}", queued="status = 'queued'")
# The queues in %(queues)s: each queue's due rows by its own index (u3j_job_queue_ready, the
# queue's name first), then the first of them all. A queue filter on the ready index read every
# due row of the other queues first: behind a backlog of 1,000,000 in another queue, 190 ms a
# claim (``EXPLAIN ANALYZE``). A queue's rows past the limit stay locked until the claim
# commits, skipped by other workers meanwhile.
# The status is matched as a range of one value, as that index's predicate says it, which does
# not imply the ready index's ``status = 'queued'``: only the queue's index can then serve
# these walks, whatever the statistics say. Where another queue held nearly every row, with
# the queue's name not known when planning, the planner took the ready index.
_IN_QUEUE = "status >= 'queued' AND status <= 'queued' AND queue = wanted.name"
_DUE_IN_QUEUES = """
    SELECT job.id FROM unnest(%(queues)s::text[]) AS wanted(name), LATERAL ({walks}) AS job
    ORDER BY job.priority DESC, job.run_at, job.id
    LIMIT %(limit)s
""".format(walks=_BY_PRIORITY.format(table="{table}", queued=_IN_QUEUE))
# The claimed rows numbered as ``due`` gives them, which is the claim's order (its walks one
# priority after the other, or the queues' rows sorted), and its CTE is read back as it was
# written. Numbered here rather than in ``due``: FOR UPDATE takes no window function. No ORDER
# BY: the rows come in that order already.
_RANKED = "SELECT id, row_number() OVER () AS n FROM due"
_CLAIM_SET = """
    SET status = 'running', attempts = job.attempts + 1,
        started_at = CASE WHEN ranked.n <= %(start)s THEN %(now)s::timestamptz END,
        finished_at = NULL, worker = %(worker)s
    FROM ranked
    WHERE job.id = ranked.id
"""
_CLAIM = """
WITH due AS ({due}), ranked AS ({ranked})
UPDATE {table} AS job
{set}
RETURNING {returning}
"""
#: The planner's settings for a claim, run before it in its transaction: its plan must never
#: sort its due rows (see ``PostgresStore._finish_and_claim``), and JIT is off: a claim of given
#: queues sorts its few rows all the same, and what sorting off adds to that plan's cost would
#: JIT-compile it.
CLAIM_PLANNER = "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"
#: After a claim inside a caller's transaction: the caller's statements plan as before.
PLANNER_AGAIN = """
SELECT set_config(name, reset_val, true) FROM pg_settings WHERE name IN ('enable_sort', 'jit')
"""

# A claimed-ahead row's start, written by the thread that takes it before its function runs,
# conditional on the row still being this worker's same attempt. Committed without waiting for
# the flush to disk (``synchronous_commit`` off for this transaction alone, set in the
# statement so it costs no round trip of its own): other sessions see it at once, which is what
# recovery needs, and a crash of the database itself that loses it only means the job runs
# again with that attempt uncounted.
# The jobs come as two arrays, ids and their attempts in the same order: the threads that take
# jobs at the same moment share one statement. Each row is matched to its attempt by its
# position rather than joined to a set of pairs: PostgreSQL plans the statement at every run
# (never prepared by Django's default), and this form plans and runs faster than a join to
# ``jsonb_to_recordset`` (README, "Figures").
# The setting is made in the row filter, right after the id test (``EXPLAIN VERBOSE``, by index
# and by scan alike): a mark none of whose ids exists does not make it. Either way it is local
# to the mark's own transaction.
_MARK_STARTED = """
UPDATE {table} AS job SET started_at = %(now)s
WHERE job.id = ANY(%(ids)s::bigint[]) AND job.status = 'running' AND job.worker = %(worker)s
  AND job.attempts = (%(attempts)s::integer[])[array_position(%(ids)s::bigint[], job.id)]
  AND {lazy}
RETURNING job.id
"""
_LAZY_COMMIT = "set_config('synchronous_commit', 'off', true) IS NOT NULL"
#: Mark claimed-ahead rows started; returns the ids of those still ours.
MARK_STARTED = _MARK_STARTED.format(table=_JOB, lazy=_LAZY_COMMIT)
#: ``MARK_STARTED`` prepared by name (``db.execute_named``): a thread waits on it before each
#: claimed-ahead job runs, and planning it cost PostgreSQL more than running it.
MARK_STARTED_NAMED = Named(
    MARK_STARTED,
    {"now": "timestamptz", "ids": "bigint[]", "attempts": "integer[]", "worker": "text"},
)
#: ``MARK_STARTED`` inside a caller's transaction: its commit is the caller's, left as it is.
MARK_STARTED_IN_CALLER = _MARK_STARTED.format(table=_JOB, lazy="true")

# Write how a batch of attempts ended, given as one JSON array of objects, one a finish: one
# quoted text rather than six arrays quoted element by element, far cheaper to send for the
# worker's busiest statement. Each row changes only while it is still running as this
# worker's same attempt: a job recovered by another worker,
# cancelled, or claimed again since is left alone (and its id is not returned). A retry goes
# back to the queue at its own run_at with no worker; the others keep run_at and worker. A
# Django Task's finish (``task`` true) carries its result columns; an @job's leaves them out.
_FINISH = """
UPDATE {table} AS job
SET status = f.status, finished_at = f.finished_at, last_error = f.error,
    run_at = coalesce(f.run_at, job.run_at),
    worker = CASE WHEN f.status = 'queued' THEN '' ELSE job.worker END,
    return_value = CASE WHEN f.task THEN f.return_value ELSE job.return_value END,
    error_class = CASE WHEN f.task THEN f.error_class ELSE job.error_class END,
    traceback = CASE WHEN f.task THEN f.traceback ELSE job.traceback END
FROM jsonb_to_recordset(%(finishes)s::jsonb)
     AS f(job_id bigint, attempts integer, status text, finished_at timestamptz,
          run_at timestamptz, error text, task boolean, return_value jsonb, error_class text,
          traceback text)
WHERE job.id = f.job_id AND job.status = 'running' AND job.worker = %(worker)s
  AND job.attempts = f.attempts
RETURNING job.id
"""
#: Finish a batch of attempts; returns the ids written.
FINISH = _FINISH.format(table=_JOB)

# A batch of finishes and the next claim in one round trip and one transaction: a busy worker
# writes one statement per turn of its loop. The two touch different rows (running ones of
# ours, queued ones), so they cannot conflict. Claimed rows come first, finished ids after,
# told apart by the first column.
_FINISH_AND_CLAIM = """
WITH finished AS ({finish}),
due AS ({due}),
ranked AS ({ranked}),
claimed AS (
    UPDATE {table} AS job
    {set}
    RETURNING {returning}
)
SELECT true, * FROM claimed
UNION ALL
SELECT false, id, {nulls} FROM finished
"""
# The finished rows' filler for every claimed column but the id (and for ``started_at``).
_NULLS = ", ".join(["NULL"] * len(CLAIMED_COLUMNS))


def _claiming(template: str, *, due: str) -> str:
    """A claim statement (``_CLAIM``, ``_FINISH_AND_CLAIM``) of the rows ``due`` selects."""
    return template.format(
        due=due.format(table=_JOB),
        ranked=_RANKED,
        table=_JOB,
        set=_CLAIM_SET,
        returning=_RETURNING,
        finish=FINISH,
        nulls=_NULLS,
    )


#: Claim due jobs of every queue.
CLAIM_ANY_QUEUE = _claiming(_CLAIM, due=_DUE)
#: Claim due jobs of the queues in ``%(queues)s``.
CLAIM_QUEUES = _claiming(_CLAIM, due=_DUE_IN_QUEUES)
#: Finish a batch and claim due jobs of every queue.
FINISH_AND_CLAIM_ANY_QUEUE = _claiming(_FINISH_AND_CLAIM, due=_DUE)
#: Finish a batch and claim due jobs of the queues in ``%(queues)s``.
FINISH_AND_CLAIM_QUEUES = _claiming(_FINISH_AND_CLAIM, due=_DUE_IN_QUEUES)

# The relay's claim (``relay.py``): outbox rows oldest first, and relayed rows of
# %(resend)s relays not done since %(resend_before)s, locked for the relay's transaction.
# SKIP LOCKED lets relays run side by side, and skips a row an ExactlyOnceTask holds.
CLAIM_OUTBOX = f"""
SELECT * FROM {_JOB}
WHERE (status = 'outbox' AND run_at <= %(now)s)
   OR (status = 'relayed' AND relay = ANY(%(resend)s) AND relayed_at < %(resend_before)s
       AND run_at <= %(now)s)
ORDER BY run_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

#: The scheduled occurrences of the jobs ``%(ids)s`` (of the tasks ``%(tasks)s``) whose jobs have
#: all ended, each closed once: the unique key on (task, occurrence) lets one caller alone
#: insert it, however many finish an occurrence's last jobs at once, and returns it to that
#: caller. Run after the finishes committed, so the last of them sees every other; the
#: occurrence's jobs are found through the (task, occurrence) index. A backfill's job counts
#: once a round fired its occurrence (one the backfill enqueued ahead): that fired record is
#: recorded after the job was made, found by the task's index from then.
# A job of the scheduled run of its occurrence: the round's, or a backfill's that the round then
# found there (made before the occurrence's fired record). A backfill's ``--again`` of an
# occurrence that fired already is a run of its own: it neither closes the check-in nor holds
# it open.
_OF_THE_RUN = f"""(j.enqueued_by = 'scheduler'
      OR j.enqueued_by LIKE 'backfill:%%' AND EXISTS (
          SELECT 1 FROM {_OCCURRENCE} AS o
          WHERE o.task = j.task AND o.recorded_at >= j.created_at
            AND o.occurrence = j.occurrence AND o.outcome = 'fired'))"""
CLOSE_OCCURRENCES = f"""
WITH ended AS (
    SELECT DISTINCT task, occurrence FROM {_JOB} AS j
    WHERE id = ANY(%(ids)s) AND task = ANY(%(tasks)s) AND occurrence IS NOT NULL
      AND {_OF_THE_RUN}
),
closed AS (
    SELECT e.task, e.occurrence, bool_or(j.status IN ('failed', 'cancelled')) AS failed,
           min(j.created_at) AS started_at, max(j.finished_at) AS finished_at
    FROM ended AS e JOIN {_JOB} AS j ON j.task = e.task AND j.occurrence = e.occurrence
    WHERE {_OF_THE_RUN}
    GROUP BY e.task, e.occurrence
    HAVING bool_and(j.status IN ('succeeded', 'failed', 'cancelled'))
)
INSERT INTO {_CHECK_IN} (task, occurrence, status, started_at, finished_at)
SELECT task, occurrence, CASE WHEN failed THEN 'error' ELSE 'ok' END, started_at,
       coalesce(finished_at, now())
FROM closed
ORDER BY task, occurrence
ON CONFLICT (task, occurrence) DO NOTHING
RETURNING task, occurrence, status, started_at, finished_at
"""
