-- Recovers what crashed or stalled workers held. Run by a timer in every live worker; atomic and
-- idempotent (a second run finds nothing).
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>active  KEYS[3] <prefix>stats  KEYS[4] <prefix>workers
-- KEYS[5] <prefix>paused  KEYS[6] <prefix>parked  KEYS[7] <prefix>dead  KEYS[8] <prefix>dead:info
-- KEYS[9] <prefix>jumped
-- ARGV[1] max leases, workers and dead letters to handle in this call
-- ARGV[2] dead letters kept at most (0: no limit)  ARGV[3] their longest age in ms (0: no limit)
-- ARGV[4] '1': also the entries of completed kept jobs that ran out and throttles that ended
--   (else '0')
-- Returns: {leases recovered, workers reaped, lanes handed back from their claimed lists,
--   dead letters removed by the retention limits, then the job type of each recovered job whose
--   record was found}
--
-- A lease past its deadline: its job goes back to the head of its group (it never left it) with
-- its attempt counted in the record's header, its lane to the head of ready, and its group out
-- of jumped (the burst is over: see finish.lua); a job of a group that runs several at once goes
-- back to its group's head (finish.lua's conc_end). A worker whose
-- heartbeat is past: the lanes its BLMOVE took and no claim turned into leases go back to ready.
local ready, active, stats, workers = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local paused, parked, dead, dead_info = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local prefix = string.sub(ready, 1, -6)
--@levels
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (The probe key never exists: the call also asks for the levels' mark.)
local probe = redis.pcall('EXISTS', prefix .. 'probe', levels_mark)
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
grouped_levels = probe > 0
local max, keep, max_age = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function counted(record)
  local attempts, rest = string.match(record, '^(%d+)(|.*)$')
  if not attempts then return record end -- malformed: the worker dead-letters it when it runs
  return (tonumber(attempts) + 1) .. rest
end

local lanes, types = {}, {}
local recovered, regrouped = 0, 0
local conc_back = {} -- leases of jobs of groups that run several at once: {fence, lane}
local function type_of(record)
  types[#types + 1] = string.match(record, '"type":"([^"]*)"') or '(unknown)'
end
for _, token in ipairs(redis.call('ZRANGEBYSCORE', active, '-inf', now, 'LIMIT', 0, max)) do
  local bar = string.find(token, '|', 1, true)
  if not bar then
    -- Not a lease: the member claim.lua keeps at +inf, scored lower by a caller that named it.
    redis.call('ZADD', active, 'inf', token)
  else
    redis.call('ZREM', active, token)
    recovered = recovered + 1
    local lane = string.sub(token, bar + 1)
    if string.sub(lane, 1, 2) == 'g:' then
      local key = prefix .. lane
      local head = redis.call('LINDEX', key, 0)
      redis.call('SREM', KEYS[9], string.sub(lane, 3))
      if head then
        type_of(head)
        redis.call('LSET', key, 0, counted(head))
        if redis.call('HEXISTS', paused, string.sub(lane, 3)) == 1 then
          redis.call('SADD', parked, string.sub(lane, 3))
        else
          lanes[#lanes + 1] = lane
        end
      end
    elseif string.sub(lane, 1, 2) == 'c:' then
      conc_back[#conc_back + 1] = {fence = tonumber(string.sub(token, 1, bar - 1)), lane = lane}
    else
      type_of(lane)
      lanes[#lanes + 1] = 'j:' .. counted(string.sub(lane, 3))
    end
  end
end

-- A job of a group that runs several at once (claim.lua's conc_of): back to its group's head,
-- its attempt counted, from the last leased to the first (so they stand in lease order); the
-- group's lane to the head of ready when nothing held it.
table.sort(conc_back, function(x, y) return x.fence > y.fence end)
for _, c in ipairs(conc_back) do
  local n, at = string.match(c.lane, '^c:(%d+):()')
  n = tonumber(n)
  local group, record = string.sub(c.lane, at, at + n - 1), string.sub(c.lane, at + n)
  type_of(record)
  if redis.call('HINCRBY', prefix .. 'running', group, '-1') <= 0 then redis.call('HDEL', prefix .. 'running', group) end
  local was_full = redis.call('SREM', prefix .. 'full', group) == 1
  local fresh = redis.call('LPUSH', prefix .. 'g:' .. group, counted(record)) == 1
  if fresh then regrouped = regrouped + 1 end
  if fresh or was_full then
    if redis.call('HEXISTS', paused, group) == 1 then
      redis.call('SADD', parked, group)
    else
      lanes[#lanes + 1] = 'g:' .. group
    end
  end
end

local reaped, handed = 0, 0
for _, worker in ipairs(redis.call('ZRANGEBYSCORE', workers, '-inf', now, 'LIMIT', 0, max)) do
  local claimed = prefix .. 'claimed:' .. worker
  for _, lane in ipairs(redis.call('LRANGE', claimed, 0, -1)) do
    lanes[#lanes + 1] = lane
    handed = handed + 1
  end
  redis.call('DEL', claimed)
  redis.call('ZREM', workers, worker)
  reaped = reaped + 1
end

push_lanes(lanes, true)
-- When asked (ARGV[4] '1'), entries of completed kept jobs that ran out (see finish.lua), and
-- throttles that ended of groups no job came back to (claim.lua takes the others): up to max each.
if ARGV[4] == '1' then
  local ended = redis.call('ZRANGEBYSCORE', prefix .. 'throttled', '-inf', now, 'LIMIT', 0, max)
  if #ended > 0 then redis.call('ZREM', prefix .. 'throttled', unpack(ended)) end
  local gone_ids = redis.call('ZRANGEBYSCORE', prefix .. 'done', '-inf', now, 'LIMIT', 0, max)
  for _, id in ipairs(gone_ids) do
    local entry = redis.call('HGET', prefix .. 'jobs', id)
    if entry and (string.sub(entry, 1, 1) == 'c' or string.sub(entry, 1, 1) == 'k') then redis.call('HDEL', prefix .. 'jobs', id) end
  end
  if #gone_ids > 0 then redis.call('ZREM', prefix .. 'done', unpack(gone_ids)) end
end
if recovered > 0 then redis.call('HINCRBY', stats, 'recovered', recovered) end
if regrouped > 0 then redis.call('HINCRBY', stats, 'groups', regrouped) end

-- Dead-letter retention: the oldest go first, past the age limit or over the count.
local expired = {}
if max_age > 0 then expired = redis.call('ZRANGEBYSCORE', dead, '-inf', now - max_age, 'LIMIT', 0, max) end
if keep > 0 and #expired < max then
  local over = redis.call('ZCARD', dead) - #expired - keep
  if over > 0 then
    expired = redis.call('ZRANGE', dead, 0, #expired + math.min(over, max - #expired) - 1)
  end
end
if #expired > 0 then
  redis.call('ZREM', dead, unpack(expired))
  redis.call('HDEL', dead_info, unpack(expired))
end
local out = {recovered, reaped, handed, #expired}
for _, t in ipairs(types) do out[#out + 1] = t end
return out
