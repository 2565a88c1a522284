-- Resumes a paused or halted group.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>paused  KEYS[3] <prefix>parked  KEYS[4] <prefix>dead
-- KEYS[5] <prefix>dead:info  KEYS[6] <prefix>ids  KEYS[7] <prefix>stats  KEYS[8] <prefix>fence
-- KEYS[9] <prefix>jumped
-- ARGV[1] group  ARGV[2] 'retry' (a halted group's head job runs again with its attempts reset)
--   or 'skip' (the head job goes to the dead letters first; only while the group's lane is parked)
-- Returns: 1 resumed; 0 the group was not paused; error when skip finds the group's head running.
local ready, paused, parked, dead, dead_info, ids, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local prefix = string.sub(ready, 1, -6)
--@levels
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (The probe key never exists: the call also asks for the levels' mark.)
local probe = redis.pcall('EXISTS', prefix .. 'probe', levels_mark)
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
grouped_levels = probe > 0
local group, mode = ARGV[1], ARGV[2]
local state = redis.call('HGET', paused, group)
if not state then return 0 end
local key = prefix .. 'g:' .. group
local is_parked = redis.call('SISMEMBER', parked, group) == 1
if mode == 'skip' and not is_parked then
  return redis.error_reply("JOBRT:24 group '" .. group .. "' is running or waiting to run; pause it and let it stop first")
end
redis.call('HDEL', paused, group)
if not is_parked then return 1 end -- its lane is in ready, running or waiting for a retry: it goes on
redis.call('SREM', parked, group)
redis.call('SREM', KEYS[9], group) -- a parked group runs no burst (see finish.lua)
local head = redis.call('LINDEX', key, 0)
local halted = string.find(state, '"halted"', 1, true)
if head and mode == 'skip' then
  redis.call('LPOP', key)
  -- A halted job's letter keeps its record as its last run saw it (as finish.lua's letters do:
  -- the halt counted that run in the header) and says why it halted.
  -- It does not run again: its runs are what its header counts (a halt counted its last run).
  local record, why = head, 'skipped by an operator'
  local runs = tonumber(string.match(head, '^(%d+)|')) or 0
  if halted then
    local ok_state, st = pcall(cjson.decode, state)
    if ok_state and type(st) == 'table' and type(st.error) == 'string' then
      why = why .. ' after it halted its group: ' .. st.error
    end
    local n, rest = string.match(head, '^(%d+)(|.*)$')
    if n and tonumber(n) > 0 then record = string.format('%d', tonumber(n) - 1) .. rest end
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local id, body = string.match(head, '^%d+|([^|]*)|(.*)$')
  local ok, decoded = pcall(cjson.decode, body or '')
  -- the producer's id (not all digits, or flagged "u" by an older producer) is free again
  if id and (string.find(id, '%D') or (ok and type(decoded) == 'table' and decoded.u)) then
    redis.call('SREM', ids, id)
  end
  local letter = id or '' -- keyed as finish.lua does, with a fence of its own
  while letter == '' or redis.call('HEXISTS', dead_info, letter) == 1 do
    letter = letter .. '#' .. redis.call('INCR', KEYS[8])
  end
  redis.call('ZADD', dead, now, letter)
  redis.call('HSET', dead_info, letter,
    cjson.encode({record = record, group = group, error = why, at = now, runs = runs}))
  redis.call('HINCRBY', stats, 'failed', 1)
  if id and string.find(body, '^{"keep":%d') then -- (see finish.lua)
    redis.call('HDEL', prefix .. 'jobs', id)
    if type(redis.pcall('SPUBLISH', prefix .. 'ended', id)) == 'table' then redis.call('PUBLISH', prefix .. 'ended', id) end
  end
  if redis.call('EXISTS', key) == 0 then redis.call('HINCRBY', stats, 'groups', -1) end
elseif head and halted then
  local rest = string.match(head, '^%d+(|.*)$')
  if rest then redis.call('LSET', key, 0, '0' .. rest) end
end
if redis.call('EXISTS', key) == 1 then push_lanes({'g:' .. group}) end
return 1
