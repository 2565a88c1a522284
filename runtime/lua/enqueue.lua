-- Stores a batch of jobs, in order.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>seq  KEYS[3] <prefix>ids  KEYS[4] <prefix>stats
-- KEYS[5] <prefix>delayed
-- KEYS[6] (optional, shard k of a sharded queue on one server) jobrt:{<queue>}:marks: when a job
--   due now is stored, the shard is marked there (ZADD NX, scored by the time in ms) as a
--   producer would after the call (see PROTOCOL.md)
-- ARGV[1] n (or '<n>:<shards>:<k>' for shard k of a sharded queue), then n times: id ('' =
--   assign one), group ('' = ungrouped), body, due ('' = now, '+<ms>' = that long from now,
--   '<ms>' = at that time in milliseconds since the epoch); then, optionally, n times: the
--   job's max group size ('' = none): the most jobs its group may hold once the job is stored,
--   counting the group's list (pending and running) and this call's jobs for it, due now or
--   later. A job over it refuses the whole call (JOBRT:26), before anything is written.
-- Returns: n times: id, duplicate (1: a job with this producer-given id is pending or running,
--   or has an entry in <prefix>jobs: a kept job's, until its keep after it ended runs out)
--
-- A job whose body starts '{"keep":<ms>' is kept in the index <prefix>jobs while it is pending
-- and for <ms> after it completes (finish.lua): its id -> '<state><ms>:<length of group>:<group>
-- <record>', state 'p' (pending, ms 0) or 'd' (due at ms). Other jobs cost the index nothing.
--
-- A job is stored as the record '<attempts before>|<id>|<body>': ungrouped, as the lane
-- 'j:<record>' in ready (or in its level's list: see levels below); grouped, at the tail of
-- <prefix>g:<group>, and the lane 'g:<group>' goes to ready (or its level's list) only when that
-- list was empty (the group had no pending or running job).
-- A job due later waits in delayed, scored by its due time: ungrouped as 'j:<record>', grouped as
-- 'd:<order>:<length of group>:<group><record>' (it joins its group when it is due). <order> is
-- a number from seq, 16 digits wide: members with one score sort by it, so grouped jobs due at
-- the same time join their group in enqueue order. When a job is due before everything else
-- there, SPUBLISH <prefix>delayed wakes the workers' promoters.
local ready, seq, ids, stats, delayed = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix = string.sub(ready, 1, -6)
--[levels: the priorities (the other scripts get this block in place of their line '--@levels')
-- A lane waits in the list of its level. A job's priority is "prio":P among its body's leading
-- fields (after a keep, rate, conc and weight, each optional, in that order), P one of 2, 1, -1,
-- -2; a lane of level P waits in <prefix>ready:<P>, every other lane (level 0) in ready. An
-- ungrouped job's lane 'j:<record>' is of its job's level; a group's lane 'g:<group>' of its
-- head job's when the lane is pushed (it stays in that list while it waits, whatever goes to its
-- group's head meanwhile). Claims read ready:2, ready:1, ready, ready:-1, ready:-2, in that
-- order (claim.lua). Workers block on ready alone, so while a level's list holds lanes, ready
-- is not empty: a push to such a list that finds ready empty puts the wake entry 'w:' there
-- (claims drop it).
-- A group's head is read (LINDEX) only in a queue that marks it stored grouped jobs with a
-- priority (<prefix>levels, set by enqueue.lua; it goes only with the whole queue): the
-- scripts that push lanes ask for the mark in the EXISTS each makes anyway (grouped_levels),
-- the others when they first push a group's lane.
local level_keys = {prefix .. 'ready:2', prefix .. 'ready:1', prefix .. 'ready:-1', prefix .. 'ready:-2'}
local levels_mark = prefix .. 'levels'
local grouped_levels = nil -- whether the queue holds the mark (nil: not asked yet)
local level_fields = {'^"keep":%d+,', '^"rate":%[%d+,%d+%],', '^"conc":%d+,', '^"weight":%d+,'}
-- The level of a record ('<attempts>|<id>|<body>') starting at s[from].
local function record_level(s, from)
  if not string.find(s, '"prio":', from, true) then return 0 end
  local at = select(2, string.find(s, '^%d+|[^|]*|{', from))
  if not at then return 0 end
  at = at + 1
  for _, field in ipairs(level_fields) do
    local _, e = string.find(s, field, at)
    if e then at = e + 1 end
  end
  return tonumber(string.match(s, '^"prio":(%-?[12]),', at)) or 0
end
local function level_of(lane)
  local kind = string.sub(lane, 1, 2)
  if kind == 'j:' then return record_level(lane, 3) end
  if kind ~= 'g:' then return 0 end
  if grouped_levels == nil then grouped_levels = redis.call('EXISTS', levels_mark) == 1 end
  if not grouped_levels then return 0 end
  local head = redis.call('LINDEX', prefix .. lane, 0)
  return head and record_level(head, 1) or 0
end
-- A record's "conc":N (after a keep and a rate limit; 1 without): its group may run up to N of
-- its jobs at once (claim.lua).
local function conc_of(record)
  if not string.find(record, '"conc":', 1, true) then return 1 end
  local n = string.match(record, '^%d+|[^|]*|{"conc":([1-9]%d*),') or
    string.match(record, '^%d+|[^|]*|{"keep":%d+,"conc":([1-9]%d*),') or
    string.match(record, '^%d+|[^|]*|{"rate":%[%d+,%d+%],"conc":([1-9]%d*),') or
    string.match(record, '^%d+|[^|]*|{"keep":%d+,"rate":%[%d+,%d+%],"conc":([1-9]%d*),')
  return tonumber(n) or 1
end
-- The list of a level's lanes.
local function level_list(level)
  if level == 0 then return ready end
  return level_keys[level > 0 and 3 - level or 2 - level]
end
-- Pushes lanes to a list, in their order: at its tail, or (at_head) at its head. Returns its length.
-- A wake entry at ready's head makes way for lanes pushed there: they wake the workers now, and
-- the wake entry is only ever at the head (where counts and claims look for it).
local function push_list(key, lanes, at_head)
  local len = 0
  if at_head then
    if key == ready and #lanes > 0 and redis.call('LINDEX', ready, 0) == 'w:' then redis.call('LPOP', ready) end
    for last = #lanes, 1, -4000 do
      local part = {}
      for i = last, math.max(last - 3999, 1), -1 do part[#part + 1] = lanes[i] end
      len = redis.call('LPUSH', key, unpack(part))
    end
  else
    for first = 1, #lanes, 4000 do len = redis.call('RPUSH', key, unpack(lanes, first, math.min(first + 3999, #lanes))) end
  end
  return len
end
-- Pushes lanes to their levels' lists, in their order: at the tails, or (at_head) at the heads.
-- Returns whether any went to a level's list, and the list of the last lane. A claim pushes with
-- no wake entry (quiet): it reads ready after, and wakes the levels once it is done.
local function push_lanes(lanes, at_head, quiet)
  local of, leveled = {}, false
  for i, lane in ipairs(lanes) do
    of[i] = level_of(lane)
    if of[i] ~= 0 then leveled = true end
  end
  if not leveled then
    if #lanes > 0 then push_list(ready, lanes, at_head) end
    return false, ready
  end
  local by = {[2] = {}, [1] = {}, [0] = {}, [-1] = {}, [-2] = {}}
  for i, lane in ipairs(lanes) do
    local list = by[of[i]]
    list[#list + 1] = lane
  end
  if #by[0] > 0 then push_list(ready, by[0], at_head) end
  for _, level in ipairs({2, 1, -1, -2}) do
    if #by[level] > 0 then push_list(level_list(level), by[level], at_head) end
  end
  if #by[0] == 0 and not quiet and redis.call('LLEN', ready) == 0 then redis.call('RPUSH', ready, 'w:') end
  return true, level_list(of[#of])
end
-- After lanes left ready: the wake entry, when ready is empty and a level's list is not.
local function wake_levels()
  if redis.call('LLEN', ready) == 0 and redis.call('EXISTS', unpack(level_keys)) > 0 then
    redis.call('RPUSH', ready, 'w:')
  end
end
--levels]
-- Whether a body may have a priority: most start '{"type"' (no leading field at all), and then
-- the search of the whole body is skipped.
local function may_have_level(body)
  return string.byte(body, 3) ~= 116 and string.find(body, '"prio":', 1, true) ~= nil
end
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (The probe key never exists: the call also asks for the levels' mark.)
local probe = redis.pcall('EXISTS', prefix .. 'probe', levels_mark)
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
grouped_levels = probe > 0
-- A grouped job with a priority: the queue is marked, before its group's lane is pushed.
local function mark_levels()
  if not grouped_levels then
    redis.call('SET', levels_mark, '1')
    grouped_levels = true
  end
end
local n = tonumber(ARGV[1])
-- Shard k of a queue of S shards ('<n>:<S>:<k>') assigns the ids m * S + k (see PROTOCOL.md).
local stride, offset, marks = 1, 0, nil
if not n then
  local count, shards, shard = string.match(ARGV[1], '^(%d+):(%d+):(%d+)$')
  if count and tonumber(shards) > 0 and tonumber(shard) < tonumber(shards) then
    n, stride, offset, marks = tonumber(count), tonumber(shards), tonumber(shard), KEYS[6]
  end
end
local function ms(time) return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) end
if not n or n < 0 or n % 1 ~= 0 then
  return redis.error_reply("JOBRT:20 job count '" .. ARGV[1] .. "' is not a whole number")
end
local limited = #ARGV == 1 + n * 5 and n > 0 -- max group sizes follow the jobs
if #ARGV ~= 1 + n * 4 and not limited then
  return redis.error_reply(string.format(
    'JOBRT:20 a count of %d jobs needs %d arguments after it (id, group, body, due each), or %d (and a max group size each); got %d',
    n, n * 4, n * 5, #ARGV - 1))
end

-- One job due now, the usual call: what the general path below does for it, without its tables
-- (a script's tables and closures cost microseconds when Redis runs it after an idle spell).
-- Only a job that plainly passes the checks below takes it (an id with no '|', not all digits,
-- no white space at its ends, and no kept job's entry; a body without "max"); any other goes
-- the general way.
local id1 = ARGV[2]
if n == 1 and not limited and ARGV[5] == '' and not string.find(ARGV[4], '"max"', 1, true) and
    (id1 == '' or (not string.find(id1, '|', 1, true) and string.find(id1, '%D') and
      not string.find(id1, '^%s') and not string.find(id1, '%s$') and
      redis.call('HEXISTS', prefix .. 'jobs', id1) == 0)) then
  local id, group = id1, ARGV[3]
  if id == '' then
    id = string.format('%d', redis.call('INCRBY', seq, '1') * stride + offset)
  elseif redis.call('SADD', ids, id) == 0 then
    redis.call('HINCRBY', stats, 'duplicates', '1') -- (also a write: a WAIT after this call covers the first one's)
    return {id, 1}
  end
  local record = '0|' .. id .. '|' .. ARGV[4]
  local level = may_have_level(ARGV[4]) and record_level(record, 1) or 0
  if group == '' then
    if level ~= 0 then push_lanes({'j:' .. record}) else redis.call('RPUSH', ready, 'j:' .. record) end
  else
    if level ~= 0 then mark_levels() end
    if redis.call('RPUSH', prefix .. 'g:' .. group, record) == 1 then
      if level ~= 0 then push_lanes({'g:' .. group}) else redis.call('RPUSH', ready, 'g:' .. group) end
      redis.call('HINCRBY', stats, 'groups', '1')
    end
  end
  if string.find(ARGV[4], '^{"keep":%d') then
    redis.call('HSET', prefix .. 'jobs', id, string.format('p0:%d:', #group) .. group .. record)
  end
  redis.call('HINCRBY', stats, 'enqueued', '1')
  if marks then redis.call('ZADD', marks, 'NX', ms(redis.call('TIME')), string.format('%d', offset)) end
  return {id, 0}
end

-- Everything is checked before anything is written: a script that fails halfway keeps what it
-- wrote, and a producer's ids would stay taken by jobs never stored.
local find, byte = string.find, string.byte
local function spaced(id) -- white space (Lua's %s: 9 to 13, 32) at either end
  local a, z = byte(id, 1), byte(id, -1)
  return a == 32 or z == 32 or (a >= 9 and a <= 13) or (z >= 9 and z <= 13)
end
local missing, timed, timed_grouped = 0, false, 0
for i = 0, n - 1 do
  local id, body, due = ARGV[2 + i * 4], ARGV[4 + i * 4], ARGV[5 + i * 4]
  if id == '' then
    missing = missing + 1
  elseif find(id, '|', 1, true) then
    return redis.error_reply("JOBRT:21 job id '" .. id .. "' contains '|'")
  elseif not find(id, '%D') then -- the ids this script assigns are all digits
    return redis.error_reply("JOBRT:21 job id '" .. id .. "' is all digits, like the ids the queue assigns; give it a prefix")
  elseif spaced(id) then
    return redis.error_reply("JOBRT:21 job id '" .. id .. "' starts or ends with white space")
  end
  -- A max below 1 would dead-letter the job unrun. Bodies are not decoded here (that costs
  -- microseconds a job): only one whose text may hold such a max is, and its own field decides.
  if find(body, '"max"', 1, true) and find(body, '"max"%s*:%s*[-0]') then
    local ok, job = pcall(cjson.decode, body)
    local max = ok and type(job) == 'table' and job.max
    if type(max) == 'number' and (max < 1 or max ~= math.floor(max)) then
      return redis.error_reply(string.format('JOBRT:22 job max_attempts is %.14g; it must be at least 1', max))
    end
  end
  if due ~= '' then
    local digits = string.match(due, '^%+?(%d+)$') -- at most 15: a number Lua holds exactly
    if not digits or #digits > 15 then
      return redis.error_reply("JOBRT:23 job " .. (i + 1) .. " due '" .. due .. "' is not '', '+<ms>' or '<ms since the epoch>'")
    end
    timed = true
    if ARGV[3 + i * 4] ~= '' then timed_grouped = timed_grouped + 1 end
  end
end

-- Whether a kept job's entry holds the id: any entry but a completed or cancelled job's whose
-- keep ran out (a later completion takes that away; a kept job stored now writes over it).
local function kept_holds(id)
  local entry = redis.call('HGET', prefix .. 'jobs', id)
  if not entry then return false end
  local state = string.sub(entry, 1, 1)
  if state ~= 'c' and state ~= 'k' then return true end
  local gone = redis.call('ZSCORE', prefix .. 'done', id)
  return not gone or tonumber(gone) > ms(redis.call('TIME'))
end

-- Max group sizes: each group's list and the jobs of this call that join it (duplicates, of
-- ids pending or given twice here, do not), in order; the first job over its group's limit
-- refuses the call.
if limited then
  local held, seen = {}, {}
  for i = 0, n - 1 do
    local id, group, max = ARGV[2 + i * 4], ARGV[3 + i * 4], ARGV[2 + n * 4 + i]
    if max ~= '' and not string.find(max, '^[1-9]%d*$') then
      return redis.error_reply("JOBRT:20 job " .. (i + 1) .. " max group size '" .. max .. "' is not a whole number of at least 1")
    end
    local duplicate = id ~= '' and (seen[id] or redis.call('SISMEMBER', ids, id) == 1 or kept_holds(id))
    if id ~= '' then seen[id] = true end
    if group ~= '' and not duplicate then
      -- (a group that runs several jobs at once holds those that run too: they left its list)
      held[group] = (held[group] or redis.call('LLEN', prefix .. 'g:' .. group) +
        tonumber(redis.call('HGET', prefix .. 'running', group) or '0')) + 1
      if max ~= '' and held[group] > tonumber(max) then
        -- (by '..': string.format's %s would cut a group name at a zero byte)
        return redis.error_reply("JOBRT:26 group '" .. group .. "' would hold " .. string.format('%d', held[group]) ..
          ' jobs, over its max group size of ' .. max .. string.format(' (job %d of %d): nothing was stored', i + 1, n))
      end
    end
  end
end

local next_id, next_order = 0, 0
if missing + timed_grouped > 0 then
  next_id = redis.call('INCRBY', seq, missing + timed_grouped) - missing - timed_grouped
  next_order = next_id + missing
end
local now = 0
if timed then now = ms(redis.call('TIME')) end

local out, lanes, groups, order, slot, later, kept = {}, {}, {}, {}, {}, {}, {}
local leveled = false -- whether a job due now may have a priority
local stored, earliest, duplicates, due_now = 0, nil, 0, 0
for i = 0, n - 1 do
  local id, group, body, due = ARGV[2 + i * 4], ARGV[3 + i * 4], ARGV[4 + i * 4], ARGV[5 + i * 4]
  local duplicate = 0
  if id == '' then
    next_id = next_id + 1
    id = string.format('%d', next_id * stride + offset) -- not tostring(): that prints a float, microseconds each
  elseif kept_holds(id) or redis.call('SADD', ids, id) == 0 then
    duplicate = 1
    duplicates = duplicates + 1
  end
  out[#out + 1] = id
  out[#out + 1] = duplicate
  if duplicate == 0 then
    stored = stored + 1
    local record = '0|' .. id .. '|' .. body
    local at = nil
    if due ~= '' then
      if string.sub(due, 1, 1) == '+' then at = now + tonumber(string.sub(due, 2)) else at = tonumber(due) end
      if at <= now then at = nil end
    end
    if find(body, '^{"keep":%d') then
      kept[#kept + 1] = id
      kept[#kept + 1] = string.format('%s%d:%d:', at and 'd' or 'p', at or 0, #group) .. group .. record
    end
    if group ~= '' and byte(body, 3) ~= 116 and find(body, '"prio":', 1, true) and record_level(record, 1) ~= 0 then
      mark_levels() -- (may_have_level)
      if not at then leveled = true end
    end
    if at then
      local member = 'j:' .. record
      if group ~= '' then
        next_order = next_order + 1
        member = string.format('d:%016d:%d:', next_order, #group) .. group .. record
      end
      later[#later + 1] = at
      later[#later + 1] = member
      if not earliest or at < earliest then earliest = at end
    elseif group == '' then
      due_now = due_now + 1
      lanes[#lanes + 1] = 'j:' .. record
      if not leveled and byte(body, 3) ~= 116 and find(body, '"prio":', 1, true) then leveled = true end -- (may_have_level)
    else
      due_now = due_now + 1
      local list = groups[group]
      if not list then
        list = {}
        groups[group] = list
        order[#order + 1] = group
        lanes[#lanes + 1] = false -- the group's lane, if it turns out to be idle
        slot[group] = #lanes
      end
      list[#list + 1] = record
    end
  end
end

local new_groups = 0 -- groups that had no jobs: stats.groups counts groups with jobs
for _, group in ipairs(order) do
  local list = groups[group]
  if push_list(prefix .. 'g:' .. group, list) == #list then
    lanes[slot[group]] = 'g:' .. group
    new_groups = new_groups + 1
  end
end
local final = {}
for i = 1, #lanes do
  if lanes[i] then final[#final + 1] = lanes[i] end
end
if leveled then push_lanes(final) else push_list(ready, final) end
for i = 1, #kept, 4000 do redis.call('HSET', prefix .. 'jobs', unpack(kept, i, math.min(i + 3999, #kept))) end
if #later > 0 then
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  for i = 1, #later, 4000 do redis.call('ZADD', delayed, unpack(later, i, math.min(i + 3999, #later))) end
  if #first == 0 or earliest < tonumber(first[2]) then
    -- SPUBLISH: on a cluster only the queue's shard hears it; before Redis 7.0, PUBLISH.
    if type(redis.pcall('SPUBLISH', delayed, earliest)) == 'table' then redis.call('PUBLISH', delayed, earliest) end
  end
end
if stored > 0 then redis.call('HINCRBY', stats, 'enqueued', string.format('%d', stored)) end
if new_groups > 0 then redis.call('HINCRBY', stats, 'groups', string.format('%d', new_groups)) end
if duplicates > 0 then redis.call('HINCRBY', stats, 'duplicates', string.format('%d', duplicates)) end
if marks and due_now > 0 then redis.call('ZADD', marks, 'NX', ms(redis.call('TIME')), string.format('%d', offset)) end
return out
