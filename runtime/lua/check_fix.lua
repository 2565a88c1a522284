-- check's second stage: confirms one thing that its walk of the queue (bounded pages of plain
-- reads, see runtime/src/backend/check_walk.hpp) found wrong, and with repair fixes it. The walk
-- is not one instant, so this looks again, atomically, at that one group, job copy, worker or id.
-- Bounded: a search of a long list (ready, a group) looks at most ARGV[3] entries from each end.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>active  KEYS[3] <prefix>delayed  KEYS[4] <prefix>paused
-- KEYS[5] <prefix>parked  KEYS[6] <prefix>ids  KEYS[7] <prefix>workers  KEYS[8] <prefix>stats
-- ARGV[1] '1' to repair  ARGV[2] what  ARGV[3] the search bound, then by what:
--   group   ARGV[4] the group; ARGV[5..] workers whose claimed lists the walk saw
--   copy    ARGV[4] the job's id; ARGV[5..7] where it was first seen: ready | claimed | delayed |
--           lease | group, the worker or group, the member as read; ARGV[8..10] the other copy
--   worker  ARGV[4] the worker
--   id      ARGV[4] the id
--   count   ARGV[4] the groups the walk found; ARGV[5..] the stats hash as the walk saw it
-- Returns {stuck (0|1), repairs made, problem...}, a problem being {code, values...}:
--   {'stuck', jobs} {'lanes', where...} {'parked'} {'empty', where} {'unsure', the list's length}
--   {'copy'} {'worker', lanes} {'id'} {'count', counted, found} {'runs', counted, leases}
-- Invariants (see ARCHITECTURE): a group with jobs has exactly one of: its lane in ready, in a
-- worker's claimed list or in delayed, a lease, a parked lane (paused), or a full one (its runs
-- at its concurrency); no lane or lease
-- names a group without jobs; a job is in one place; a taken id has its job; no lanes sit in the
-- claimed list of a worker with no heartbeat.
local ready, active, delayed, paused, parked, ids, workers, stats =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local prefix = string.sub(ready, 1, -6)
--@levels
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (The probe key never exists: the call also asks for the levels' mark.)
local probe = redis.pcall('EXISTS', prefix .. 'probe', levels_mark)
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
grouped_levels = probe > 0
local repair, what, bound = ARGV[1] == '1', ARGV[2], tonumber(ARGV[3])
local problems, repaired, stuck = {}, 0, 0

-- Where value is in a list: {position, from the tail?} each, searched from the head and, when the
-- list is longer than bound, from the tail; and whether a middle part went unsearched.
local function find_in(key, value)
  local found = {}
  for _, p in ipairs(redis.call('LPOS', key, value, 'COUNT', 0, 'MAXLEN', bound)) do found[#found + 1] = {p, false} end
  local len = redis.call('LLEN', key)
  if len > bound then
    for _, p in ipairs(redis.call('LPOS', key, value, 'RANK', -1, 'COUNT', 0, 'MAXLEN', bound)) do
      if p >= bound then found[#found + 1] = {p, true} end
    end
  end
  return found, len > 2 * bound, len
end
-- Removes one copy found by find_in, searching from the end it was found from (bounded too).
local function remove_found(key, value, f) redis.call('LREM', key, f[2] and -1 or 1, value) end

local function glob(text) return (string.gsub(text, '([%*%?%[%]\\])', '\\%1')) end

if what == 'group' then
  local group = ARGV[4]
  local lane = 'g:' .. group
  local holders = {} -- {where = ..., remove = function}
  local found, unsure, len = find_in(ready, lane)
  for _, f in ipairs(found) do
    holders[#holders + 1] = {where = 'ready', remove = function() remove_found(ready, lane, f) end}
  end
  for i, level in ipairs({2, 1, -1, -2}) do -- (a group's lane waits in its head's level: see levels)
    local key = level_keys[i]
    local in_level, unsure_there, there = find_in(key, lane)
    for _, f in ipairs(in_level) do
      holders[#holders + 1] = {where = 'ready:' .. level, remove = function() remove_found(key, lane, f) end}
    end
    if unsure_there and not unsure then unsure, len = true, there end
  end
  local names, listed = redis.call('ZRANGE', workers, 0, -1), {}
  for i = 5, #ARGV do names[#names + 1] = ARGV[i] end
  for _, w in ipairs(names) do
    if not listed[w] then
      listed[w] = true
      local key = prefix .. 'claimed:' .. w
      for _ in ipairs(redis.call('LPOS', key, lane, 'COUNT', 0)) do
        holders[#holders + 1] = {where = 'claimed:' .. w, remove = function() redis.call('LREM', key, -1, lane) end}
      end
    end
  end
  if redis.call('ZSCORE', delayed, lane) then
    holders[#holders + 1] = {where = 'delayed', remove = function() redis.call('ZREM', delayed, lane) end}
  end
  local tokens, cursor = {}, '0'
  repeat
    local r = redis.call('ZSCAN', active, cursor, 'MATCH', '*|' .. glob(lane), 'COUNT', 1000)
    cursor = r[1]
    for i = 1, #r[2], 2 do
      local token = r[2][i]
      if not tokens[token] and string.sub(token, string.find(token, '|', 1, true) + 1) == lane then
        tokens[token] = true
        holders[#holders + 1] = {where = 'a lease', lease = true, remove = function() redis.call('ZREM', active, token) end}
      end
    end
  until cursor == '0'
  if redis.call('SISMEMBER', parked, group) == 1 then
    holders[#holders + 1] = {where = 'parked', remove = function() redis.call('SREM', parked, group) end}
  end
  -- The runs counted of a group that runs several jobs at once (claim.lua's conc_of), against
  -- its leases ('<fence>|c:<length of group>:<group><record>'); <prefix>full holds the lane only
  -- while such a run goes on, whose end puts it back.
  local mark, leases, seen = 'c:' .. string.format('%d', #group) .. ':' .. group, 0, {}
  cursor = '0'
  repeat
    local r = redis.call('ZSCAN', active, cursor, 'MATCH', '*|' .. glob(mark) .. '*', 'COUNT', 1000)
    cursor = r[1]
    for i = 1, #r[2], 2 do
      local token = r[2][i]
      local lane = string.sub(token, string.find(token, '|', 1, true) + 1)
      if not seen[token] and string.sub(lane, 1, #mark) == mark then
        seen[token] = true
        leases = leases + 1
      end
    end
  until cursor == '0'
  local counted = tonumber(redis.call('HGET', prefix .. 'running', group) or '0')
  if counted ~= leases then
    problems[#problems + 1] = {'runs', counted, leases}
    if repair then
      if leases > 0 then
        redis.call('HSET', prefix .. 'running', group, string.format('%d', leases))
      else
        redis.call('HDEL', prefix .. 'running', group)
      end
      repaired = repaired + 1
    end
  end
  if redis.call('SISMEMBER', prefix .. 'full', group) == 1 then
    if leases > 0 then
      holders[#holders + 1] = {where = 'full', remove = function() redis.call('SREM', prefix .. 'full', group) end}
    elseif repair then
      redis.call('SREM', prefix .. 'full', group)
    end
  end
  local jobs = redis.call('LLEN', prefix .. 'g:' .. group)
  local is_paused = redis.call('HEXISTS', paused, group) == 1
  if jobs > 0 then
    if #holders == 0 and unsure then
      problems[#problems + 1] = {'unsure', len}
    elseif #holders == 0 then
      stuck = 1
      problems[#problems + 1] = {'stuck', jobs}
      if repair then
        if is_paused then redis.call('SADD', parked, group) else push_lanes({lane}) end
        repaired = repaired + 1
      end
    elseif #holders > 1 then
      local line = {'lanes'}
      for _, h in ipairs(holders) do line[#line + 1] = h.where end
      problems[#problems + 1] = line
      if repair then -- keep a lease if there is one (it cannot be dropped), else the first holder
        local keep = 1
        for i, h in ipairs(holders) do if h.lease then keep = i end end
        for i, h in ipairs(holders) do if i ~= keep and not h.lease then h.remove() end end
        repaired = repaired + 1
      end
    end
    if holders[1] and holders[1].where == 'parked' and not is_paused then
      problems[#problems + 1] = {'parked'}
      if repair then
        redis.call('SREM', parked, group)
        push_lanes({lane})
        repaired = repaired + 1
      end
    end
  else
    for _, h in ipairs(holders) do
      if h.where ~= 'parked' then problems[#problems + 1] = {'empty', h.where} end
      if repair then
        h.remove()
        if h.where ~= 'parked' then repaired = repaired + 1 end
      end
    end
  end
elseif what == 'copy' then
  -- Finds a copy where the walk saw it: a function that drops it, false when it is not there,
  -- nil when the search could not tell (a middle part of a long list went unsearched). `nth`:
  -- the copy is the same entry as the first one (one list, one text: a walk that read an entry
  -- twice as the list moved): then it is there only when the list holds it twice.
  local function place(kind, key, member, nth)
    -- (ready's key: '' for ready itself, else a level: ready:<level>)
    local list = kind == 'ready' and (key == '' and ready or prefix .. 'ready:' .. key) or
                   kind == 'claimed' and prefix .. 'claimed:' .. key or
                   kind == 'group' and prefix .. 'g:' .. key
    if list then
      local found, unsure = find_in(list, member)
      if found[nth] then return function() remove_found(list, member, found[nth]) end end
      if unsure then return nil end
      return false
    end
    -- (A zset holds a member once: the same member twice is one entry read twice.)
    local zset = kind == 'delayed' and delayed or active
    if nth == 1 and redis.call('ZSCORE', zset, member) then return function() redis.call('ZREM', zset, member) end end
    return false
  end
  local same = ARGV[5] == ARGV[8] and ARGV[6] == ARGV[9] and ARGV[7] == ARGV[10]
  local first, second = place(ARGV[5], ARGV[6], ARGV[7], 1), place(ARGV[8], ARGV[9], ARGV[10], same and 2 or 1)
  local droppable = {ready = true, claimed = true, delayed = true}
  if first and second then
    problems[#problems + 1] = {'copy'}
    if repair then
      if droppable[ARGV[8]] then second() elseif droppable[ARGV[5]] then first() end
      if droppable[ARGV[8]] or droppable[ARGV[5]] then repaired = repaired + 1 end
    end
  end
elseif what == 'worker' then
  local worker = ARGV[4]
  local key = prefix .. 'claimed:' .. worker
  local lanes = redis.call('LRANGE', key, 0, -1) -- a claimed list holds what one BLMOVE took
  if #lanes > 0 and not redis.call('ZSCORE', workers, worker) then
    problems[#problems + 1] = {'worker', #lanes}
    if repair then
      push_list(ready, lanes, true)
      redis.call('DEL', key)
      repaired = repaired + 1
    end
  end
elseif what == 'id' then
  if redis.call('SISMEMBER', ids, ARGV[4]) == 1 then
    problems[#problems + 1] = {'id'}
    if repair then
      redis.call('SREM', ids, ARGV[4])
      repaired = repaired + 1
    end
  end
elseif what == 'count' then
  -- The walk's count holds only if the queue did not change since: the stats hash as it saw it.
  local now, quiet = redis.call('HGETALL', stats), true
  if #now ~= #ARGV - 4 then quiet = false end
  local was = {}
  for i = 5, #ARGV, 2 do was[ARGV[i]] = ARGV[i + 1] end
  for i = 1, #now, 2 do if was[now[i]] ~= now[i + 1] then quiet = false end end
  local counted = tonumber(redis.call('HGET', stats, 'groups') or '0')
  if quiet and counted ~= tonumber(ARGV[4]) then
    problems[#problems + 1] = {'count', counted, tonumber(ARGV[4])}
    if repair then
      redis.call('HSET', stats, 'groups', ARGV[4])
      repaired = repaired + 1
    end
  end
else
  return redis.error_reply('check_fix: unknown ' .. tostring(what))
end
if repaired > 0 then wake_levels() end -- (what was removed may have been ready's last lane)
local out = {stuck, repaired}
for _, p in ipairs(problems) do out[#out + 1] = p end
return out
