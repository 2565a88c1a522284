-- Leases up to max jobs to a worker: lanes its blocking claim moved to <prefix>claimed:<worker>
-- first, then lanes from the head of ready (with priorities: after ready:2 and ready:1, before
-- ready:-1 and ready:-2; see levels below).
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>active  KEYS[3] <prefix>fence  KEYS[4] <prefix>stats
-- KEYS[5] <prefix>claimed:<worker>  KEYS[6] <prefix>paused  KEYS[7] <prefix>parked
-- ARGV[1] max  ARGV[2] lease TTL (ms)  ARGV[3] ahead: followers of a grouped job to hand over
--   with it, at most  ARGV[4] (optional) the queue's rate limit, '<max>:<window ms>' (below)
-- Returns: per job: token, record ('' for an ungrouped job: its record is in the token), the
--   number of its followers, then their records (fences: the token's + 1, + 2, ...), and last
--   'more' when the call stopped at its bound of lanes passed over with room left (the caller
--   calls again); or, when the queue's rate limit lets nothing start, {'limited', ms until a
--   start may}
--
-- A lease is the member '<fence>|<lane>' of active, scored by its deadline (server time, ms).
-- One more member, at +inf and with no '|', is no lease: longer than zset-max-listpack-value, it
-- keeps active a skiplist. Tokens are short, and a set of a few leases (a shard's) would be a
-- listpack, where each of a claim's inserts and a finish's lookups walks the whole set: on 48
-- shards, a fifth of an ungrouped job's Redis CPU. Readers count active below +inf (a ZCOUNT,
-- not a ZCARD); the reaper's range never reaches it.
-- A grouped job stays at the head of its group's list while it runs, and its followers behind
-- it: the worker finishes each but the last with 'k' (see finish.lua). The lane of a paused
-- group is parked instead (resume puts it back).
local ready, active, fence_key, stats, claimed = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local paused, parked = KEYS[6], KEYS[7]
local prefix = string.sub(ready, 1, -6)
--@levels
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (One call also asks whether any group is throttled, whether any level's list holds lanes and
-- for the levels' mark: the probe key itself never exists, and EXISTS counts a key named five
-- times five times; the mark is named ten times, the four lists once each.)
local throttled, mark = prefix .. 'throttled', levels_mark
local probe = redis.pcall('EXISTS', prefix .. 'probe', throttled, throttled, throttled, throttled, throttled,
                          mark, mark, mark, mark, mark, mark, mark, mark, mark, mark, unpack(level_keys))
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
local any_throttled, any_levels = probe % 10 >= 5, probe % 5 > 0
grouped_levels = probe >= 10
local max, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
-- Numbers go to Redis as strings ('%d' or as given): Lua's own conversion of a number (and
-- Redis's of a number argument) prints it as a float, which costs microseconds.
local ahead = ARGV[3] or '0'
local now = nil
local function clock()
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  return now
end

-- The queue's rate limit, when the worker has one (ARGV[4] '<max>:<window ms>'): the starts of
-- the last window are the zset <prefix>rate, each lease's fence scored by when it was leased
-- (those that left the window go first; the set holds at most the highest limit given). A lease
-- that never started gives its start back (finish.lua's 'b' and 'u', release.lua: ZREM of its
-- fence). The claim leases no more than the room left, and no followers (each is a start); with
-- none left it leases nothing, puts back at the head of ready what its blocking claim moved to
-- claimed:<worker> (in order), and answers {'limited', ms until the oldest start leaves}.
local queue_rate = nil
if ARGV[4] and ARGV[4] ~= '' and max > 0 then
  local limit, window = string.match(ARGV[4], '^([1-9]%d*):([1-9]%d*)$')
  if not limit then return redis.error_reply("JOBRT:20 queue rate '" .. ARGV[4] .. "' is not '<max>:<window ms>', both at least 1") end
  limit, window = tonumber(limit), tonumber(window)
  queue_rate = {prefix .. 'rate', window}
  redis.call('ZREMRANGEBYSCORE', queue_rate[1], '-inf', string.format('%d', clock() - window))
  local counted = redis.call('ZCARD', queue_rate[1])
  local room = limit - counted
  if room <= 0 then
    local moved = redis.call('LRANGE', claimed, '0', '-1')
    if #moved > 0 then
      redis.call('DEL', claimed)
      push_list(ready, moved, true)
    end
    -- (the start whose end leaves room: the oldest, unless a worker with a higher limit counted more)
    local at = string.format('%d', counted - limit)
    local oldest = redis.call('ZRANGE', queue_rate[1], at, at, 'WITHSCORES')
    return {'limited', string.format('%d', math.max(1, tonumber(oldest[2]) + window - clock()))}
  end
  if room < max then max = room end
  ahead = '0'
end

-- The lanes this worker's blocking claim moved come first, then lanes from ready; with
-- priorities (levels, above), ready:2 and ready:1 before them, ready:-1 and ready:-2 after. A
-- lane parked or dropped on the way is replaced by the next one, up to 100 of them a call
-- (bounded work). A wake entry ('w:') is dropped where it is met.
local taken, records_of, fences = {}, {}, 0 -- records_of[i]: the records of a grouped taken[i]
-- Whether any group is paused, and whether any runs several jobs at once (<prefix>running, group
-- -> its jobs leased now): one EXISTS of both, asked once, at the first grouped lane that has
-- jobs; only when either exists, which one.
local running = prefix .. 'running'
local any_paused, any_running = nil, nil
local function ask_flags()
  local n = redis.call('EXISTS', paused, running)
  any_paused = n > 0 and redis.call('EXISTS', paused) == 1
  any_running = n > (any_paused and 1 or 0)
end
local moved = redis.call('LPOP', claimed, string.format('%d', max)) or {}
-- (Every level's list when one holds lanes or the queue is marked. When a group's lane went back
-- to a list read already in this call, the lists are read again from that one as soon as the
-- list being read is done (rewind): no lane of a lower level starts before it, and a claim that
-- leaves room leaves no lane it could take. The lanes a blocking claim moved and ready count as
-- one list there: a claim reads the same lanes in the same order as one that moved none.)
local sources = {claimed, ready}
if any_levels or grouped_levels then sources = {level_keys[1], level_keys[2], claimed, ready, level_keys[3], level_keys[4]} end
local source, lanes, home, moved_read = 0, {}, ready, false -- home: where lanes of sources[source] go back
local rewind = nil -- the first source read already that a lane went back to
local passed, asked = 0, 0 -- asked: how many lanes the last LPOP of a list asked for
local again = 0 -- lanes this round put back in ready with room for more (see conc_of): read on

-- A kept job cancelled before it started (cancel.lua's entry 'n...') is dropped here, where it
-- would be leased: its entry becomes 'k<ms>:...' and goes after its keep, as a completed job's.
-- Only kept records are looked up: other jobs pay a plain find of '|{"keep":' (a pattern, or a
-- copy of the record, would cost a job's time in microseconds).
local find, keep_mark = string.find, '|{"keep":'
local jobs = prefix .. 'jobs'
local function cancelled(record) -- the entry, when the job's cancel waits for it
  if not (find(record, keep_mark, 1, true) and find(record, '^%d+|[^|]*|{"keep":%d')) then return nil end
  local entry = redis.call('HGET', jobs, string.match(record, '^%d+|([^|]*)|'))
  if entry and string.sub(entry, 1, 1) == 'n' then return entry end
end
local function drop(record, entry)
  local id, keep = string.match(record, '^%d+|([^|]*)|{"keep":(%d+)')
  clock()
  redis.call('HSET', jobs, id, string.format('k%d', now) .. string.sub(entry, (string.find(entry, ':', 1, true))))
  redis.call('ZADD', prefix .. 'done', string.format('%d', now + tonumber(keep)), id)
  if string.find(id, '%D') then redis.call('SREM', prefix .. 'ids', id) end -- a producer's id is free again
  -- (Whoever waits for its end, if it ran when it was cancelled: its worker died since.)
  if type(redis.pcall('SPUBLISH', prefix .. 'ended', id)) == 'table' then redis.call('PUBLISH', prefix .. 'ended', id) end
  passed = passed + 1
end

-- A group that may not start yet waits in delayed, as a retry's backoff does, while the others
-- go on: one throttled (finish.lua: its handler asked, and its group had no job left then; with
-- jobs left, finish.lua delayed its lane itself), or one whose head job carries a rate limit
-- its group has reached. A limited group's starts in the last window are the times in
-- <prefix>rate:<group>, newest first, at most max of them; a job starts when fewer than max
-- are within the window, and is counted then. A limited head goes without followers (each of
-- them is a start to count), and followers go up to the first limited one.
local later = {}
local rate_mark = '"rate":['
local function rate_of(record) -- a record's rate limit: max, window (ms), from its body's start
  local m, w = string.match(record, '^%d+|[^|]*|{"rate":%[([1-9]%d*),(%d+)%]')
  if not m then m, w = string.match(record, '^%d+|[^|]*|{"keep":%d+,"rate":%[([1-9]%d*),(%d+)%]') end
  if m then return tonumber(m), tonumber(w) end
end
local function limited(record) return find(record, rate_mark, 1, true) and rate_of(record) end

-- A group may run up to N jobs at once when its head's body says so ("conc":N, after a keep and
-- a rate limit: conc_of, see levels). Such a head leaves the list when it starts and travels in its lease's lane,
-- 'c:<length of group>:<group><record>'; the group's lane goes back to the tail of ready (or of
-- its next head's level's list, see levels) while fewer than N run, else waits in the set <prefix>full until one of them ends (finish.lua,
-- reap.lua and release.lua put it back). A head of N = 1 behind such runs waits for all to end.
-- A weighted group ("weight":W after a concurrency, in its head's body) gets W times the
-- followers of an unweighted one each time its lane is claimed: W × (ahead + 1) jobs a lease,
-- at most 1,000. Its lane goes back to the tail of ready after them, as any lane, so when more
-- lanes are ready than slots are free, its starts over a cycle of ready are W times as many. A
-- group that runs several at once starts up to W heads a turn (fewer when N would be passed):
-- <prefix>turn, '<starts>:<group>', counts the starts of the turn going on, and until W have
-- started its lane is met again: next in this call, or, when the call has no room left, first
-- in the next (at the head of ready, before the lanes this call read after it); then it goes
-- to the tail. One key for the queue, so no key is left behind. A turn that stops early (its
-- next head may not start yet) keeps its count, and goes on at that group's next start of such
-- a head; another such group's weighted start ends it (rare: the lane waits at the head).
local weight_mark = '"weight":'
local function weight_of(record)
  if not find(record, weight_mark, 1, true) then return 1 end
  local at = select(2, find(record, '^%d+|[^|]*|{'))
  if not at then return 1 end
  at = at + 1
  for _, field in ipairs({'^"keep":%d+,', '^"rate":%[%d+,%d+%],', '^"conc":%d+,'}) do
    local _, e = find(record, field, at)
    if e then at = e + 1 end
  end
  return math.min(tonumber(string.match(record, '^"weight":([1-9]%d?%d?),', at)) or 1, 100)
end
-- Cuts a lease's followers, from records[from] on, at the first cancelled one (it is dropped as
-- a head), the first limited one or the first of a group that runs several at once (each
-- starts as a head).
local function cut_followers(records, from)
  for j = from, #records do
    if (find(records[j], keep_mark, 1, true) and cancelled(records[j])) or limited(records[j]) or
        conc_of(records[j]) > 1 then
      for k = #records, j, -1 do records[k] = nil end
      return
    end
  end
end
local function throttled_until(group) -- when its throttle ends, if later than now
  local till = redis.call('ZSCORE', prefix .. 'throttled', group)
  if not till then return nil end
  if tonumber(till) > clock() then return tonumber(till) end
  redis.call('ZREM', prefix .. 'throttled', group)
end
local function rate_wait(group, record) -- when the group may start its head, if later than now
  local max, window = rate_of(record)
  local key = prefix .. 'rate:' .. group
  local oldest = redis.call('LINDEX', key, string.format('%d', max - 1))
  if oldest and tonumber(oldest) + window > clock() then return tonumber(oldest) + window end
  redis.call('LPUSH', key, string.format('%d', clock()))
  redis.call('LTRIM', key, '0', string.format('%d', max - 1))
  redis.call('PEXPIRE', key, string.format('%d', window))
end

while true do
  for i, lane in ipairs(lanes) do
    -- (A weighted group's turn took the room, or the claim passed over as many lanes as it may:
    -- the rest, the turn's lane first, wait at the head. Counted lane by lane, the bound stops
    -- a claim at the same lane however the lanes came, moved by a blocking claim or popped.)
    if #taken >= max or passed >= 100 then
      push_list(home, {unpack(lanes, i)}, true)
      break
    end
    if lane == 'w:' then
      -- (a wake entry: see levels)
    elseif string.sub(lane, 1, 2) == 'g:' then
      local key = prefix .. lane
      local records = redis.call('LRANGE', key, '0', ahead)
      local entry = records[1] and find(records[1], keep_mark, 1, true) and cancelled(records[1])
      while entry and passed < 100 do -- cancelled heads leave their group
        drop(redis.call('LPOP', key), entry)
        records = redis.call('LRANGE', key, '0', ahead)
        entry = records[1] and cancelled(records[1])
        if #records == 0 then redis.call('HINCRBY', stats, 'groups', '-1') end
      end
      -- Followers go with the lease up to the first cancelled one (it is dropped as a head), the
      -- first limited one or the first of a group that runs several at once (each starts as a
      -- head, see conc_of).
      local listed = #records -- (before the followers are cut)
      cut_followers(records, 2)
      if entry then
        -- (more to drop than this call may: the next one goes on)
        if push_lanes({lane}, true, true) then any_levels = true end
      elseif #records == 0 then
        passed = passed + 1 -- a stale lane of an emptied group is dropped
      else
        if any_paused == nil then ask_flags() end
        local group, wait = string.sub(lane, 3), nil
        if any_paused and redis.call('HEXISTS', paused, group) == 1 then
          redis.call('SADD', parked, group)
          passed = passed + 1
        else
          if any_throttled then wait = throttled_until(group) end
          -- A head of N > 1 counts its run at once (one command where asking first would take
          -- two), and takes it back when it does not start.
          local conc, runs = conc_of(records[1]), 0
          local counted_run = conc > 1 and not wait
          if counted_run then
            runs = redis.call('HINCRBY', running, group, '1') - 1
            any_running = true
          elseif any_running then
            runs = tonumber(redis.call('HGET', running, group) or '0')
          end
          if not wait and runs >= conc then
            redis.call('SADD', prefix .. 'full', group)
            passed = passed + 1
            wait = false
          end
          if wait == nil and limited(records[1]) then
            wait = rate_wait(group, records[1])
            for k = #records, 2, -1 do records[k] = nil end
          end
          if counted_run and wait ~= nil and redis.call('HINCRBY', running, group, '-1') <= 0 then
            redis.call('HDEL', running, group)
          end
          if wait == false then
            -- (full: its lane waits for a run to end)
          elseif wait then
            later[#later + 1] = string.format('%d', wait)
            later[#later + 1] = lane
            passed = passed + 1
          elseif conc > 1 then -- its head leaves the list; the lane goes on while there is room
            local record = redis.call('LPOP', key)
            -- (whether it was the last: the records read say so, unless none were asked for
            -- after the head)
            local last = listed == 1
            if listed == 1 and tonumber(ahead) < 1 then last = redis.call('EXISTS', key) == 0 end
            local weight = find(record, weight_mark, 1, true) and weight_of(record) or 1
            local turn_on = false
            if weight > 1 then
              local turn = prefix .. 'turn'
              local starts, of = string.match(redis.call('GET', turn) or '', '^(%d+):(.*)$')
              starts = of == group and tonumber(starts) + 1 or 1
              turn_on = not last and runs + 1 < conc and starts < weight
              if turn_on then
                redis.call('SET', turn, string.format('%d:', starts) .. group)
              elseif of then
                redis.call('DEL', turn)
              end
            end
            if last then
              redis.call('HINCRBY', stats, 'groups', '-1')
            elseif turn_on then
              table.insert(lanes, i + 1, lane) -- (met next, or first in the next claim)
            elseif runs + 1 < conc then
              local leveled, list = push_lanes({lane}, false, true)
              if leveled then any_levels = true end
              if list == home then
                again = again + 1
              else
                for k = 1, source - 1 do
                  if sources[k] == list and not (rewind and rewind < k) then rewind = k end
                end
              end
            else
              redis.call('SADD', prefix .. 'full', group)
            end
            taken[#taken + 1] = 'c:' .. string.format('%d:', #group) .. group .. record
            fences = fences + 1
          else
            -- A weighted head takes W times the followers (read now that it starts, past those
            -- read already when the list may hold more), up to where they are cut.
            if #records == tonumber(ahead) + 1 and not queue_rate and find(records[1], weight_mark, 1, true) and
                not limited(records[1]) then
              local want = math.min(weight_of(records[1]) * (tonumber(ahead) + 1), 1000) - 1
              if want > #records - 1 then
                local from = #records + 1
                local more = redis.call('LRANGE', key, string.format('%d', #records), string.format('%d', want))
                for _, record in ipairs(more) do records[#records + 1] = record end
                cut_followers(records, from)
              end
            end
            taken[#taken + 1] = lane
            records_of[#taken] = records
            fences = fences + #records
          end
        end
      end
    else
      -- (a lane that is neither, written by hand, is taken as a job's record, kept whole: the
      -- worker dead-letters it as malformed)
      if string.sub(lane, 1, 2) ~= 'j:' then lane = 'j:' .. lane end
      local entry = find(lane, keep_mark, 1, true) and cancelled(string.sub(lane, 3))
      if entry then
        drop(string.sub(lane, 3), entry)
      else
        taken[#taken + 1] = lane
        fences = fences + 1
      end
    end
  end
  local need = max - #taken
  if need <= 0 or passed >= 100 then break end
  -- (the next list, unless this one may hold more: it gave all that was asked, or lanes went back to it)
  if source == 0 or sources[source] == claimed or (#lanes < asked and again == 0) then
    if rewind and sources[source] ~= claimed then source, rewind = rewind, nil else source = source + 1 end
  end
  if not sources[source] then break end
  again = 0
  if sources[source] == claimed then
    lanes, home, asked = moved_read and {} or moved, ready, 0
    moved_read = true
  else
    asked, home = need, sources[source]
    lanes = redis.call('LPOP', home, string.format('%d', need)) or {}
  end
end
if not moved_read then push_list(ready, moved, true) end -- (the room ran out before them: back at ready's head)
if any_levels then wake_levels() end
if #later > 0 then -- (as finish.lua: the promoters hear of a new earliest due time)
  local delayed = prefix .. 'delayed'
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  redis.call('ZADD', delayed, unpack(later))
  local earliest = tonumber(later[1])
  for j = 3, #later, 2 do earliest = math.min(earliest, tonumber(later[j])) end
  if #first == 0 or earliest < tonumber(first[2]) then
    earliest = string.format('%d', earliest)
    if type(redis.pcall('SPUBLISH', delayed, earliest)) == 'table' then redis.call('PUBLISH', delayed, earliest) end
  end
end
-- Stopped by the bound with room left: the caller claims again (a trailing 'more'), so that a
-- claim that returns fewer than it asked for leaves nothing it could take.
local more = passed >= 100 and #taken < max
if #taken == 0 then return more and {'more'} or {} end

local deadline = string.format('%d', clock() + ttl)
local fence = redis.call('INCRBY', fence_key, string.format('%d', fences)) - fences
local leases, out = {'inf', 'the set stays a skiplist: this member, longer than a listpack holds, is not a lease'}, {}
local starts, at = {}, string.format('%d', clock()) -- the queue's rate limit's: score, fence
for i, lane in ipairs(taken) do
  local records = records_of[i]
  fence = fence + 1
  local token = string.format('%d|', fence) .. lane
  if queue_rate then
    starts[#starts + 1] = at
    starts[#starts + 1] = string.format('%d', fence)
  end
  leases[#leases + 1] = deadline
  leases[#leases + 1] = token
  out[#out + 1] = token
  if records then
    out[#out + 1] = records[1]
    out[#out + 1] = #records - 1
    for j = 2, #records do out[#out + 1] = records[j] end
    fence = fence + #records - 1
  else
    out[#out + 1] = ''
    out[#out + 1] = 0
  end
end
redis.call('ZADD', active, unpack(leases))
redis.call('HINCRBY', stats, 'started', string.format('%d', #taken))
if queue_rate then -- each lease is one start (no followers)
  redis.call('ZADD', queue_rate[1], unpack(starts))
  redis.call('PEXPIRE', queue_rate[1], string.format('%d', queue_rate[2]))
end
if more then out[#out + 1] = 'more' end
return out
