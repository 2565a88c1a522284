-- Cancels a kept job (one enqueued with a keep: see enqueue.lua) by its id.
-- KEYS[1] <prefix>jobs
-- ARGV[1] id
-- Returns the state its entry had: 'p' or 'd' (cancelled now), 'n' or 'k' (cancelled before),
--   'c' (completed: nothing changes), or '' (no entry: no such kept job, or its keep ran out).
--
-- A pending or delayed job's entry becomes 'n<ms>:...' (ms: now) and the job stays where it is:
-- the call that would lease it drops it instead (claim.lua, finish.lua), and its entry becomes
-- 'k<ms>:...', which goes after its keep as a completed job's does. A running job has the
-- same entry (leases do not touch the index): its worker asks after the kept jobs it runs at
-- each lease renewal, cancels the handler, and ends the run with finish.lua's 'c'.
local jobs, id = KEYS[1], ARGV[1]
local prefix = string.sub(jobs, 1, -5)
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
local probe = redis.pcall('EXISTS', prefix .. 'probe')
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
local entry = redis.call('HGET', jobs, id)
if not entry then return '' end
local state = string.sub(entry, 1, 1)
if state ~= 'p' and state ~= 'd' then return state end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', jobs, id, string.format('n%d', now) .. string.sub(entry, (string.find(entry, ':', 1, true))))
-- Whoever waits for its end (backend::wait_ended) hears it now: it will not start.
if type(redis.pcall('SPUBLISH', prefix .. 'ended', id)) == 'table' then redis.call('PUBLISH', prefix .. 'ended', id) end
return state
