-- One step of a repeatable job (backend.hpp's fire_schedule): while the schedule is as its caller
-- saw it, enqueues its firings (with enqueue.lua, whose text the line '--@enqueue.lua' below
-- stands for) and moves its next firing on, all at once: no firing is enqueued twice or lost.
-- KEYS: enqueue.lua's
-- ARGV[1] name, ARGV[2] the value the caller saw (schedule_put.lua), ARGV[3] the next firing it
--   saw (ms), ARGV[4] the next firing after this step; then enqueue.lua's arguments, one job per
--   firing (a count of 0 when every firing was skipped)
-- Returns {0} when the schedule is gone or changed, or another caller took the step; {1,
-- enqueue.lua's reply} when it was taken; {2, the refusal} when enqueue.lua refused the jobs (a
-- full group): the schedule moved on without them.
local prefix = string.sub(KEYS[1], 1, -6)
-- (On a cluster, while the queue's slot migrates: wait, before any read. See PROTOCOL.md.)
local probe = redis.pcall('EXISTS', prefix .. 'probe')
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
local schedules, due = prefix .. 'schedules', prefix .. 'schedule_due'
local name, seen, at, after = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local next_at = redis.call('ZSCORE', due, name)
if not next_at or tonumber(next_at) ~= tonumber(at) or redis.call('HGET', schedules, name) ~= seen then return {0} end
for _ = 1, 4 do table.remove(ARGV, 1) end
local stored = (function()
--@enqueue.lua
end)()
local refused = type(stored) == 'table' and stored.err
if refused and string.sub(refused, 1, 6) ~= 'JOBRT:' then return stored end
redis.call('ZADD', due, after, name)
if refused then return {2, refused} end
return {1, stored}
