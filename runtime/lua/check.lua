-- Checks the invariants of a queue's data model and, when asked, repairs what it finds. Reads
-- everything (SCAN of the queue's keys): O(size of the queue), for operators and tests.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>active  KEYS[3] <prefix>delayed  KEYS[4] <prefix>paused
-- KEYS[5] <prefix>parked  KEYS[6] <prefix>ids  KEYS[7] <prefix>workers  KEYS[8] <prefix>stats
-- ARGV[1] '1' to repair
-- Returns: {groups with jobs, pending jobs, oldest pending job's enqueue time (ms, 0: none),
--   stuck groups, repairs made, then one line per problem}
--
-- Invariants: a group with jobs has exactly one of: its lane in ready, in a worker's claimed
-- list or in delayed, a lease, or a parked lane (paused); a parked group is paused; no lane or
-- lease names a group without jobs; a producer-given id in ids belongs to a pending job, and a
-- job id is in one place only; no lanes sit in the claimed list of a worker that has no
-- heartbeat.
-- Repair of a job in two places keeps a group's record or a lease (neither can be dropped: a
-- running job stays at its group's head) and drops a lane's copy (in ready, a claimed list or
-- delayed); a lease on a group without jobs is removed: its job is gone, and a finish under it
-- would pop a job enqueued to the group since, which another worker may be running.
local ready, active, delayed, paused, parked, ids, workers = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local prefix = string.sub(ready, 1, -6)
local repair = ARGV[1] == '1'
local problems, repaired = {}, 0
local holders, seen_ids, leases_of = {}, {}, {}
local drops = {} -- copies of jobs to drop, after the scan (it reads lists that a drop changes)
local oldest, jobs = 0, 0

-- The queue's name may hold glob characters: the prefix is matched literally.
local literal_prefix = string.gsub(prefix, '([%*%?%[%]\\])', '\\%1')
local function scan(pattern)
  local keys, cursor = {}, '0'
  repeat
    local r = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = r[1]
    for _, k in ipairs(r[2]) do keys[#keys + 1] = k end
  until cursor == '0'
  return keys
end
local function hold(group, where)
  local h = holders[group] or {}
  h[#h + 1] = where
  holders[group] = h
end
-- drop removes this copy of the job (nil: a group's record or a lease, which stay).
local function job_at(record, where, drop)
  local id = string.match(record, '^%d+|([^|]*)|')
  if not id then
    problems[#problems + 1] = 'malformed record in ' .. where .. ': ' .. string.sub(record, 1, 60)
    return
  end
  local first = seen_ids[id]
  if first then
    problems[#problems + 1] = 'job ' .. id .. ' is in ' .. first.where .. ' and in ' .. where
    if repair and drop then
      drops[#drops + 1] = drop
      repaired = repaired + 1
    elseif repair and first.drop then
      drops[#drops + 1] = first.drop
      seen_ids[id] = {where = where}
      repaired = repaired + 1
    end
  else
    seen_ids[id] = {where = where, drop = drop}
  end
  jobs = jobs + 1
  local at = tonumber(string.match(record, '"at":(%d+)'))
  if at and (oldest == 0 or at < oldest) then oldest = at end
end
local function lane(l, where, drop)
  if string.sub(l, 1, 2) == 'g:' then hold(string.sub(l, 3), where) else job_at(string.sub(l, 3), where, drop) end
end

for _, l in ipairs(redis.call('LRANGE', ready, 0, -1)) do
  lane(l, 'ready', function() redis.call('LREM', ready, -1, l) end)
end
local live = {}
for i, w in ipairs(redis.call('ZRANGE', workers, 0, -1)) do live[w] = true end
for _, key in ipairs(scan(literal_prefix .. 'claimed:*')) do
  local worker = string.sub(key, #prefix + 9)
  local lanes = redis.call('LRANGE', key, 0, -1)
  for _, l in ipairs(lanes) do
    lane(l, 'claimed:' .. worker, function() -- or in ready, when the repair below put it back
      if redis.call('LREM', key, -1, l) == 0 then redis.call('LREM', ready, 1, l) end
    end)
  end
  if not live[worker] and #lanes > 0 then
    problems[#problems + 1] = #lanes .. ' lanes held by worker ' .. worker .. ', which has no heartbeat'
    if repair then
      for i = #lanes, 1, -1 do redis.call('LPUSH', ready, lanes[i]) end
      redis.call('DEL', key)
      repaired = repaired + 1
    end
  end
end
for _, member in ipairs(redis.call('ZRANGE', delayed, 0, -1)) do
  local kind = string.sub(member, 1, 2)
  local function drop() redis.call('ZREM', delayed, member) end
  if kind == 'd:' then
    local len, rest = string.match(member, '^d:%d+:(%d+):(.*)$')
    if rest then job_at(string.sub(rest, tonumber(len) + 1), 'delayed', drop) end
  else
    lane(member, 'delayed', drop)
  end
end
for _, token in ipairs(redis.call('ZRANGE', active, 0, -1)) do
  local bar = string.find(token, '|', 1, true)
  if bar then
    local l = string.sub(token, bar + 1)
    if string.sub(l, 1, 2) == 'g:' then
      local tokens = leases_of[string.sub(l, 3)] or {}
      tokens[#tokens + 1] = token
      leases_of[string.sub(l, 3)] = tokens
    end
    lane(l, 'a lease')
  end
end
for _, group in ipairs(redis.call('SMEMBERS', parked)) do hold(group, 'parked') end

local groups, stuck = 0, 0
for _, key in ipairs(scan(literal_prefix .. 'g:*')) do
  local group = string.sub(key, #prefix + 3)
  local records = redis.call('LRANGE', key, 0, -1)
  if #records > 0 then
    groups = groups + 1
    for _, r in ipairs(records) do job_at(r, 'group ' .. group) end
    local h = holders[group] or {}
    holders[group] = nil
    local is_paused = redis.call('HEXISTS', paused, group) == 1
    if #h == 0 then
      stuck = stuck + 1
      problems[#problems + 1] = 'group ' .. group .. ' has ' .. #records .. ' jobs and no lane, lease or parked lane'
      if repair then
        if is_paused then redis.call('SADD', parked, group) else redis.call('RPUSH', ready, 'g:' .. group) end
        repaired = repaired + 1
      end
    elseif #h > 1 then
      problems[#problems + 1] = 'group ' .. group .. ' has ' .. #h .. ' lanes: ' .. table.concat(h, ', ')
      if repair then -- keep a lease if there is one (it cannot be dropped), else the first holder
        local keep = 1
        for i = 1, #h do
          if h[i] == 'a lease' then keep = i end
        end
        for i = 1, #h do
          if i == keep then -- kept
          elseif h[i] == 'ready' then redis.call('LREM', ready, -1, 'g:' .. group)
          elseif h[i] == 'delayed' then redis.call('ZREM', delayed, 'g:' .. group)
          elseif h[i] == 'parked' then redis.call('SREM', parked, group)
          elseif string.sub(h[i], 1, 8) == 'claimed:' then redis.call('LREM', prefix .. h[i], -1, 'g:' .. group)
          end
        end
        repaired = repaired + 1
      end
    end
    if h[1] == 'parked' and not is_paused then
      problems[#problems + 1] = 'group ' .. group .. ' is parked but not paused'
      if repair then
        redis.call('SREM', parked, group)
        redis.call('RPUSH', ready, 'g:' .. group)
        repaired = repaired + 1
      end
    end
  end
end
for group, h in pairs(holders) do -- lanes of groups without jobs
  for _, where in ipairs(h) do
    if where == 'parked' then
      if repair then redis.call('SREM', parked, group) end
    else
      problems[#problems + 1] = 'a lane of group ' .. group .. ', which has no jobs, is in ' .. where
      if repair then
        if where == 'ready' then redis.call('LREM', ready, 0, 'g:' .. group)
        elseif where == 'a lease' then redis.call('ZREM', active, table.remove(leases_of[group]))
        elseif where == 'delayed' then redis.call('ZREM', delayed, 'g:' .. group)
        elseif string.sub(where, 1, 8) == 'claimed:' then redis.call('LREM', prefix .. where, 0, 'g:' .. group)
        end
        repaired = repaired + 1
      end
    end
  end
end
for _, drop in ipairs(drops) do drop() end
for _, id in ipairs(redis.call('SMEMBERS', ids)) do
  if not seen_ids[id] then
    problems[#problems + 1] = 'id ' .. id .. ' is taken but no pending job has it'
    if repair then
      redis.call('SREM', ids, id)
      repaired = repaired + 1
    end
  end
end
local counted = tonumber(redis.call('HGET', KEYS[8], 'groups') or '0')
if counted ~= groups then
  problems[#problems + 1] = 'stats counts ' .. counted .. ' groups with jobs; there are ' .. groups
  if repair then
    redis.call('HSET', KEYS[8], 'groups', groups)
    repaired = repaired + 1
  end
end
local out = {groups, jobs, oldest, stuck, repaired}
for _, p in ipairs(problems) do out[#out + 1] = p end
return out
