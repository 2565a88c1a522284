-- Finishes leased jobs, each checked against its token.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>active  KEYS[3] <prefix>fence  KEYS[4] <prefix>stats
-- KEYS[5] <prefix>ids  KEYS[6] <prefix>dead  KEYS[7] <prefix>dead:info  KEYS[8] <prefix>answers:<worker>
-- KEYS[9] <prefix>delayed  KEYS[10] <prefix>paused  KEYS[11] <prefix>parked  KEYS[12] <prefix>jumped
-- ARGV[1] lease TTL (ms)  ARGV[2] n  ARGV[3] call id  ARGV[4] ids of this worker's calls whose
--   answers came, space-separated (their records go), then n times: token, kind, producer-given
--   id ('' if none), and what the kind needs (one argument: Redis and Lua pay for each one):
--   'a' ack: want next and ahead, e.g. '23', then, for a kept job whose handler gave a result,
--     '|' and the result (JSON). Want next: '1' lease the group's next job to me;
--     '2' only when no other lane is waiting, so a burst costs nobody their turn; '0' no. Ahead:
--     how many of the next job's followers to hand over with it.
--   'k' ack of a grouped job whose follower (handed over by claim.lua or here) the worker runs
--     next under the same lease: the follower's job id (then '|' and a result, as 'a'). The job
--     leaves its group, the lease goes on, the follower counts as started and is made the
--     group's head: a job requeued to the
--     group's head during the burst went in behind the head, in front of the follower, and put
--     the group in jumped; the follower moves to the head, where retries, halts and the reaper
--     look for the running job, and the requeued job runs after the burst (whose end takes the
--     group out of jumped, however it ends). Groups not in jumped cost no such check.
--   'f' dead-letter: the error.
--   'a' and 'f' may carry a throttle of the job's group, 'a<ms>', 'f<ms>': the group starts
--     nothing for that long (job_context::throttle_group; see throttle below).
--   'g' give up: dead-letter a job that did not run (its earlier leases expired, it is malformed,
--     no worker could run its type): as 'f', but its group, which has waited already, keeps its
--     place: the lane goes to the head of ready, not its tail.
--   'h' halt: the error. A grouped job stays at the head with its attempt counted and the group
--     is paused until an operator resumes it (ungrouped: as 'f').
--   'r' retry (one more attempt counted) and 'd' run again later (none counted): the delay in
--     ms. The job stays where it is (a grouped one at its group's head, so the group waits for
--     it) and its lane waits in delayed that long (0: back to ready at once).
--   'u' handed back, never started, by a worker with no handler for its job's type: as 'd' (the
--     delay in ms), and it leaves the started counter for the unhandled one.
--   'b' given back, never started (its lease's local end came first): as release.lua, the lane
--     goes to the head of ready with no attempt counted and leaves the started counter; ''.
--   'c' cancelled (cancel.lua) while it ran: as 'f', but its entry in <prefix>jobs says
--     cancelled ('k<ms>:...', kept as a completed one's) and no dead letter is written; ''.
-- Returns: n times: held (1, or 0 when the lease was lost and nothing changed), alone when no
--   next job was leased; when one was, held + 2, then the next token, the next record, the
--   number of its followers and their records (fences: the next token's + 1, + 2, ...). (Most
--   items lease nothing: one value each keeps the reply, and Redis's work on it, small.)
--
-- A job enqueued with a keep (enqueue.lua) has its entry in <prefix>jobs follow it: completed,
-- 'c<ms>:<length of group>:<group>[<length of result>:<result>]<record>' with the time and the
-- result its handler gave (JSON; none, no part: a record starts '<digits>|'), and its id in <prefix>done scored by when the entry goes (up to 10
-- more than it completes of those that ran out go with each call that completes such a job, and
-- reap.lua takes them too); waiting for a retry or a run
-- later, 'd<due ms>:...'; back to run now, 'p0:...'; dead-lettered, no entry (dead:info has it).
-- A job whose cancel waits ('n<ms>:...', cancel.lua) keeps that entry when it goes back: it is
-- not leased again (claim.lua drops it), nor as a burst's next job or follower here.
--
-- Safe to send again: the result of each call is kept in the hash answers:<worker> until a
-- later call says its answer came. The same call id again (a resend after a lost reply) gets
-- that result back and changes nothing but the next jobs' leases (renewed, or reported as not
-- leased when reaped meanwhile); without it, a keep would take a second job off its group, and
-- a burst's next job leased by the first run would belong to nobody. A resent call's next jobs
-- come without followers. A record lasts 10 minutes after its worker's last call; a call sent
-- again later runs afresh, and still changes nothing: its items that ended their lease find no
-- lease, and a keep finds its follower at the head already.
local ready, active, fence_key, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ids, dead, dead_info, answers = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local delayed, paused, parked, jumps = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local prefix = string.sub(ready, 1, -6)
--@levels
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (The probe key never exists: the call also asks for the levels' mark.)
local probe = redis.pcall('EXISTS', prefix .. 'probe', levels_mark)
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
grouped_levels = probe > 0
local ttl, n, call = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

if ARGV[4] ~= '' then
  local answered = {}
  for id in string.gmatch(ARGV[4], '%S+') do answered[#answered + 1] = id end
  redis.call('HDEL', answers, unpack(answered))
end
-- A call's record holds, for each item, its held flag ('0'/'1') and its next token as
-- '<length>:<token>': cheap to write on every call, decoded only on a resend. A next job's
-- record is not kept: while its lease lasts it is the head of its group's list.
local W = 4 -- ARGV per item
local last = redis.call('HGET', answers, call)
if last then
  -- Written again: a resend writes, so a WAIT behind it covers the first call's writes too.
  redis.call('HSET', answers, call, last)
  -- A next job leased by the first run may have been reaped since (the resend came after its
  -- TTL): it is not ours to start any more. One still held gets a full TTL from now.
  local time = redis.call('TIME')
  local deadline = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) + ttl
  -- The record, item by item: its held flag and its next token.
  local helds, next_tokens, pos = {}, {}, 1
  while pos <= #last do
    local colon = string.find(last, ':', pos, true)
    local len = tonumber(string.sub(last, pos + 1, colon - 1))
    helds[#helds + 1] = tonumber(string.sub(last, pos, pos))
    next_tokens[#next_tokens + 1] = string.sub(last, colon + 1, colon + len)
    pos = colon + len + 1
  end
  -- Leases this call ended itself (with an item held that was not a keep): the keeps before it
  -- under the same token stand (a pipelined burst's keeps, then its end, in one call).
  local ended_here = {}
  for i = 1, #helds do
    local base = 5 + (i - 1) * W
    if helds[i] == 1 and ARGV[base + 1] ~= 'k' then ended_here[ARGV[base]] = true end
  end
  local out = {}
  for i = 1, #helds do
    local token, record = next_tokens[i], ''
    if token ~= '' and redis.call('ZSCORE', active, token) then
      redis.call('ZADD', active, 'XX', deadline, token)
      record = redis.call('LINDEX', prefix .. string.sub(token, string.find(token, '|', 1, true) + 1), 0) or ''
    else
      token = ''
    end
    local held = helds[i]
    -- A keep's lease goes on: it is held if it is still there, and its follower may start.
    local base = 5 + (i - 1) * W
    if held == 1 and ARGV[base + 1] == 'k' and string.find(ARGV[base], '|g:', 1, true) and
        not ended_here[ARGV[base]] and not redis.call('ZSCORE', active, ARGV[base]) then
      held = 0
    end
    if token == '' then
      out[#out + 1] = held
    else
      out[#out + 1] = held + 2
      out[#out + 1] = token
      out[#out + 1] = record
      out[#out + 1] = 0
    end
  end
  return out
end

-- held[i]: 1 when item i's lease was held, else 0; leased[i]: the next job item i leased, as
-- {token, record, followers, lane} (most items lease none).
local held, leased = {}, {}
local none = {} -- no followers (shared: never written)
local function done()
  local parts, out = {}, {}
  for i = 1, n do
    local h, x = held[i], leased[i]
    if not x then
      parts[i] = h == 1 and '10:' or '00:'
      out[#out + 1] = h
    else
      parts[i] = string.format('%d%d:', h, #x[1]) .. x[1] -- '%d': see the fences below
      out[#out + 1] = h + 2
      out[#out + 1] = x[1]
      out[#out + 1] = x[2]
      out[#out + 1] = #x[3]
      for _, record in ipairs(x[3]) do out[#out + 1] = record end
    end
  end
  redis.call('HSET', answers, call, table.concat(parts))
  redis.call('PEXPIRE', answers, '600000') -- a worker that died leaves its records behind
  return out
end

local tokens = {}
for i = 1, n do tokens[i] = ARGV[5 + (i - 1) * W] end
local scores = redis.call('ZMSCORE', active, unpack(tokens))

-- Server time in ms, asked once and only when needed (a call of keeps needs none).
local now = nil
local function clock()
  if not now then
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  return now
end

local function counted(record)
  local attempts, rest = string.match(record, '^(%d+)(|.*)$')
  if not attempts then return record end -- malformed: the worker dead-letters it when it runs
  return (tonumber(attempts) + 1) .. rest
end

local any_paused = nil -- EXISTS paused, asked once
local function is_paused(group)
  if any_paused == nil then any_paused = redis.call('EXISTS', paused) == 1 end
  return any_paused and redis.call('HEXISTS', paused, group) == 1
end

local any_jumped = nil -- EXISTS jumped, asked once
local function jumped(lane) -- (a lane 'g:<group>': its group is cut out only when asked for)
  if any_jumped == nil then any_jumped = redis.call('EXISTS', jumps) == 1 end
  return any_jumped and redis.call('SISMEMBER', jumps, string.sub(lane, 3)) == 1
end

local function id_of(record) return string.match(record, '^%d+|([^|]*)|') end
-- A kept job's entry in the index (see the top): state 'c' completed, 'p' to run again after
-- `delay` ms ('d' when that is more than 0), 'x' gone to the dead letters.
local kept_done = 0
-- (A plain find first: a pattern's match costs a job's time in microseconds, a plain one far less.)
local function kept(record)
  return record and string.find(record, '|{"keep":', 1, true) and string.find(record, '^%d+|[^|]*|{"keep":%d')
end
-- A kept job's result, JSON (the worker sends one only for a kept job): after a '|' in an ack's
-- last argument ('<want><ahead>|<result>') or a keep's ('<follower id>|<result>'); '' for none.
local function result_in(extra)
  local bar = string.find(extra, '|', 1, true)
  return bar and string.sub(extra, bar + 1) or ''
end
-- Wakes whoever waits for a kept job's end (backend::wait_ended): SPUBLISH on the queue's shard
-- of a cluster; before Redis 7.0, PUBLISH. The message is the id, and, when the job's entry in the
-- jobs hash is given and not over 1 KiB, '|' and the entry: the waiter need not read it. (Bounded:
-- the message goes to every waiting process of the queue, and down the replication stream.)
local function publish_end(id, entry)
  local message = (entry and #entry <= 1024) and (id .. '|' .. entry) or id
  if type(redis.pcall('SPUBLISH', prefix .. 'ended', message)) == 'table' then
    redis.call('PUBLISH', prefix .. 'ended', message)
  end
end
-- The entry of a kept job whose cancel waits (cancel.lua), or nil.
local function cancel_waits(record)
  if not kept(record) then return nil end
  local entry = redis.call('HGET', prefix .. 'jobs', id_of(record))
  if entry and string.sub(entry, 1, 1) == 'n' then return entry end
end
local function note(record, group, state, delay, result)
  local id, keep = string.match(record or '', '^%d+|([^|]*)|{"keep":(%d+)')
  if not id then return end
  if state == 'x' then
    redis.call('HDEL', prefix .. 'jobs', id)
    publish_end(id)
    return
  end
  if state == 'p' and cancel_waits(record) then -- back, and still not to run: its run has ended
    publish_end(id)
    return
  end
  local at = 0
  if state == 'c' or state == 'k' then
    at = clock()
    redis.call('ZADD', prefix .. 'done', string.format('%d', at + tonumber(keep)), id)
    kept_done = kept_done + 1
  elseif delay > 0 then
    state, at = 'd', clock() + delay
  end
  local entry = string.format('%s%d:%d:', state, at, #group) .. group
  if state == 'c' and result and result ~= '' then entry = entry .. string.format('%d:', #result) .. result end
  entry = entry .. record
  redis.call('HSET', prefix .. 'jobs', id, entry)
  if state == 'c' or state == 'k' then publish_end(id, entry) end
end
-- After a keep: makes the follower `id` its group's head (see 'k' above). False when the
-- group has no jobs left (drift: check reports the lease).
local function to_front(key, id)
  local head = redis.call('LINDEX', key, 0)
  if not head then return false end
  if id == '' or id_of(head) == id then return true end
  -- It stands behind the jobs requeued to the head since the burst began: read on in pages.
  for first = 1, math.huge, 1000 do
    local page = redis.call('LRANGE', key, string.format('%d', first), string.format('%d', first + 999))
    for _, record in ipairs(page) do
      if id_of(record) == id then
        redis.call('LREM', key, 1, record)
        redis.call('LPUSH', key, record)
        return true
      end
    end
    if #page < 1000 then return true end
  end
end

local back, front, nexts, later, ended, gone = {}, {}, {}, {}, {}, {}
local completed, failed, retried, deferred, halted, emptied, started, unhandled = 0, 0, 0, 0, 0, 0, 0, 0
local nobody_waits = nil -- LLEN of ready, asked once: this script pushes to ready only at its end
-- A dead letter's key is its job's id; when another dead letter has that id (a producer-given id
-- enqueued again after it failed) or the record has none, '<id>#<fence of this lease>', as often
-- as it takes (an id may itself end in '#<digits>'): nothing already dead-lettered is overwritten.
local function dead_letter(record, group, err, token)
  local key = string.match(record or '', '^%d+|([^|]*)|') or ''
  while key == '' or redis.call('HEXISTS', dead_info, key) == 1 do
    key = key .. '#' .. string.match(token, '^[^|]*')
  end
  redis.call('ZADD', dead, clock(), key)
  redis.call('HSET', dead_info, key, cjson.encode({record = record or '', group = group, error = err, at = clock()}))
  note(record, group, 'x')
  failed = failed + 1
end
-- A lane that goes back: later (a retry's backoff, which a paused group keeps: promote parks the
-- lane when it is due), parked when its group is paused, or to the tail of ready (round robin).
local function send_back(lane, delay)
  if delay > 0 then
    later[#later + 1] = clock() + delay
    later[#later + 1] = lane
  elseif string.sub(lane, 1, 2) == 'g:' and is_paused(string.sub(lane, 3)) then
    redis.call('SADD', parked, string.sub(lane, 3))
  else
    back[#back + 1] = lane
  end
end
-- A job whose body carries a rate limit (claim.lua) is not leased here as a burst's next job
-- nor handed over as a follower: claim.lua counts its start against its group's limit.
local function limited(record)
  return string.find(record, '"rate":[', 1, true) and
    (string.find(record, '^%d+|[^|]*|{"rate":%[[1-9]%d*,%d+%]') or
     string.find(record, '^%d+|[^|]*|{"keep":%d+,"rate":%[[1-9]%d*,%d+%]'))
end
-- Nor a job of a group that runs several at once (conc_of, see levels): claim.lua starts each as
-- a head.
local function runs_several(record) return conc_of(record) > 1 end
-- A handler that throttled its group (job_context::throttle_group): the group's lane waits in
-- delayed that long; a group with no job left is noted in <prefix>throttled until then, where
-- claim.lua finds it when a new job gives it a lane (throttles that ended leave the set here).
local function throttle(group, ms)
  local key = prefix .. 'throttled'
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', clock()))
  redis.call('ZADD', key, 'GT', string.format('%d', clock() + ms), group)
end
-- A group's job that never started ('b', 'u') gives back the start claim.lua counted for it
-- against its rate limit: the newest in <prefix>rate:<group>, since a group has one lease at a
-- time (a group without a limit has no such list).
local function unstarted(lane)
  redis.call('LPOP', prefix .. 'rate:' .. string.sub(lane, 3))
end
-- And any job that never started gives back its lease's start to the queue's own rate limit
-- (claim.lua's queue_rate: its fence in <prefix>rate).
local function unstarted_in_queue(token)
  redis.call('ZREM', prefix .. 'rate', string.match(token, '^(%d+)|'))
end
-- A grouped job that goes back ('r', 'd', 'u'; others count nothing): counted, and one never
-- started (handed back, 'u') gives back its starts.
local function count_back(kind, lane, token)
  if kind == 'r' then retried = retried + 1 elseif kind == 'd' then deferred = deferred + 1 end
  if kind == 'u' then
    unhandled, started = unhandled + 1, started - 1
    unstarted(lane)
    unstarted_in_queue(token)
  end
end
-- The end of a job whose group runs several at once (claim.lua's conc_of): its lease's lane is
-- 'c:<length of group>:<group><record>', the job is out of its group's list, and <prefix>running
-- counts it. An end ('a', 'f', 'g', 'c') puts back the group's lane if it waited in <prefix>full
-- for one; a job that goes back ('r', 'd', 'u', 'h', 'b') goes to its group's head, before every
-- job that has not started, and the group waits for it: its lane goes to delayed (the delay) or
-- parked, or, when another holder has it, the group is throttled for the delay (claim.lua puts
-- the lane in delayed when it meets it) or paused (claim.lua parks it).
local running, full = prefix .. 'running', prefix .. 'full'
local any_full = nil -- whether a group waits in <prefix>full: asked once a call (none adds one)
local function conc_end(token, lane, kind, pause, base)
  local n, at = string.match(lane, '^c:(%d+):()')
  n = tonumber(n)
  local group, record = string.sub(lane, at, at + n - 1), string.sub(lane, at + n)
  local group_lane = 'g:' .. group
  local key = prefix .. group_lane
  if redis.call('HINCRBY', running, group, '-1') <= 0 then redis.call('HDEL', running, group) end
  if any_full == nil then any_full = redis.call('EXISTS', full) == 1 end
  local was_full = any_full and redis.call('SREM', full, group) == 1
  if kind == 'a' or kind == 'f' or kind == 'g' or kind == 'c' then
    local unique_id, extra = ARGV[base + 2], ARGV[base + 3]
    if unique_id ~= '' then redis.call('SREM', ids, unique_id) end
    if kind == 'c' then
      note(record, group, 'k', 0)
    elseif kind == 'a' then
      completed = completed + 1
      if kept(record) then note(record, group, 'c', 0, result_in(extra)) end
    else
      dead_letter(record, group, extra, token)
    end
    if kind ~= 'a' and kind ~= 'f' then pause = 0 end
    if was_full and redis.call('EXISTS', key) == 1 then
      if pause > 0 then
        send_back(group_lane, pause)
      elseif kind == 'g' and not is_paused(group) then
        front[#front + 1] = group_lane
      else
        send_back(group_lane, 0)
      end
    elseif pause > 0 then
      throttle(group, pause)
    end
    return
  end
  if kind == 'r' or kind == 'h' then record = counted(record) end
  local lane_needed = redis.call('LPUSH', key, record) == 1 -- (nothing held a lane)
  if lane_needed then emptied = emptied - 1 end
  lane_needed = lane_needed or was_full
  if kind == 'b' then
    started = started - 1
    unstarted(group_lane)
    unstarted_in_queue(token)
    if lane_needed then front[#front + 1] = group_lane end
    return
  end
  local delay = 0
  if kind ~= 'h' then delay = tonumber(ARGV[base + 3]) or 0 end
  note(record, group, 'p', delay)
  if kind == 'h' then
    redis.call('HSET', paused, group, cjson.encode({state = 'halted', error = ARGV[base + 3], at = clock()}))
    any_paused = true
    if lane_needed then redis.call('SADD', parked, group) end
    halted = halted + 1
  elseif lane_needed then
    send_back(group_lane, delay)
  elseif delay > 0 then
    throttle(group, delay)
  end
  count_back(kind, group_lane, token)
end
-- Items are taken in order: a token is held until an item that is not 'k' ends its lease (a
-- token given twice that way is held once). Fields are read as each kind needs them. Jobs of
-- groups that run several at once are taken after the others, from the last leased to the first,
-- so that those going back to one group's head stand there in the order they were leased.
local conc_items = {}
for i = 1, n do
  local base = 5 + (i - 1) * W
  local token = tokens[i]
  held[i] = 0
  if scores[i] and not gone[token] then
    held[i] = 1
    local kind, pause = ARGV[base + 1], 0 -- an ack or a fail may carry a throttle: 'a<ms>', 'f<ms>'
    if #kind > 1 then pause, kind = tonumber(string.sub(kind, 2)) or 0, string.sub(kind, 1, 1) end
    local lane = string.sub(token, string.find(token, '|', 1, true) + 1)
    local grouped, concurrent = string.sub(lane, 1, 2) == 'g:', string.sub(lane, 1, 2) == 'c:'
    if concurrent and kind == 'k' then kind = 'a' end
    if not grouped and not concurrent and (kind == 'k' or kind == 'h') then kind = kind == 'k' and 'a' or 'f' end
    if kind ~= 'k' then -- the lease ends, and with it the burst: the next lease reads the list afresh
      gone[token] = true
      ended[#ended + 1] = token
      if grouped and jumped(lane) then redis.call('SREM', jumps, string.sub(lane, 3)) end
    end
    if concurrent then -- (after the others: see below)
      conc_items[#conc_items + 1] = {fence = tonumber(string.match(token, '^(%d+)|')), token = token, lane = lane,
                                     kind = kind, pause = pause, base = base}
    elseif kind == 'k' then
      local key = prefix .. lane
      local head = redis.call('LPOP', key)
      local follower, result = ARGV[base + 3], ''
      local bar = string.find(follower, '|', 1, true)
      if bar then follower, result = string.sub(follower, 1, bar - 1), string.sub(follower, bar + 1) end
      if head and id_of(head) == follower then
        -- The follower is the head already: this call was sent again after its record expired
        -- (a worker cut off from the server for longer than that; its lease not reaped yet) and
        -- ran the first time. The kept job is gone; the follower must stay.
        redis.call('LPUSH', key, head)
      else
        local unique_id = ARGV[base + 2]
        if unique_id ~= '' then redis.call('SREM', ids, unique_id) end
        if jumped(lane) and not to_front(key, follower) then emptied = emptied + 1 end
        if kept(head) then note(head, string.sub(lane, 3), 'c', 0, result) end
        completed = completed + 1
        started = started + 1
      end
    elseif kind == 'a' or kind == 'f' or kind == 'g' or kind == 'c' then
      local unique_id, extra = ARGV[base + 2], ARGV[base + 3]
      local want = kind == 'a' and string.sub(extra, 1, 1) or '0'
      if unique_id ~= '' then redis.call('SREM', ids, unique_id) end
      local record
      if grouped then
        local key = prefix .. lane
        record = redis.call('LPOP', key)
        local following = redis.call('LINDEX', key, 0)
        if record and not following then
          emptied = emptied + 1
          if pause > 0 then throttle(string.sub(lane, 3), pause) end
        end
        if following and pause > 0 then
          send_back(lane, pause)
        elseif following then
          if want == '2' and nobody_waits == nil then nobody_waits = redis.call('LLEN', ready) == 0 end
          if kind == 'a' and (want == '1' or (want == '2' and nobody_waits and #back == 0 and #front == 0)) and
              not is_paused(string.sub(lane, 3)) and not cancel_waits(following) and not limited(following) and
              not runs_several(following) then
            -- its token is made below, with its fence
            local x = {'', following, none, lane}
            local ahead = string.match(extra, '^.(%d+)') or '0'
            if ahead ~= '0' then
              x[3] = redis.call('LRANGE', key, '1', ahead)
              for j = 1, #x[3] do -- up to the first cancelled one (claim.lua drops it) or limited one
                if cancel_waits(x[3][j]) or limited(x[3][j]) or runs_several(x[3][j]) then
                  for k = #x[3], j, -1 do x[3][k] = nil end
                  break
                end
              end
            end
            leased[i] = x
            nexts[#nexts + 1] = x
          elseif kind == 'g' and not is_paused(string.sub(lane, 3)) then
            front[#front + 1] = lane -- it has waited already: its place
          else
            send_back(lane, 0) -- round robin: the group waits behind every other lane
          end
        end
      elseif kind ~= 'a' then
        record = string.sub(lane, 3) -- (an ack does not need the record: no copy)
      end
      if kind == 'c' then
        note(record, grouped and string.sub(lane, 3) or '', 'k', 0)
      elseif kind == 'a' then
        completed = completed + 1
        -- (the group's name, or the ungrouped record, copied only for a kept job)
        if grouped then
          if kept(record) then note(record, string.sub(lane, 3), 'c', 0, result_in(extra)) end
        elseif string.find(lane, '|{"keep":', 1, true) and string.find(lane, '^j:%d+|[^|]*|{"keep":%d') then
          note(string.sub(lane, 3), '', 'c', 0, result_in(extra))
        end
      else
        local group = ''
        if grouped then group = string.sub(lane, 3) end
        dead_letter(record, group, extra, token)
      end
    elseif kind == 'b' then
      front[#front + 1] = lane
      started = started - 1
      if grouped then unstarted(lane) end
      unstarted_in_queue(token)
    elseif grouped then -- 'r', 'd', 'u' or 'h': the job stays at its group's head
      local key = prefix .. lane
      local head = redis.call('LINDEX', key, 0)
      if head then
        if kind == 'r' or kind == 'h' then
          head = counted(head)
          redis.call('LSET', key, 0, head)
        end
        local delay = 0
        if kind ~= 'h' then delay = tonumber(ARGV[base + 3]) or 0 end
        note(head, string.sub(lane, 3), 'p', delay)
        if kind == 'h' then
          redis.call('HSET', paused, string.sub(lane, 3),
                     cjson.encode({state = 'halted', error = ARGV[base + 3], at = clock()}))
          redis.call('SADD', parked, string.sub(lane, 3))
          any_paused = true
          halted = halted + 1
        else
          send_back(lane, delay)
        end
      end
      count_back(kind, lane, token)
    else -- 'r', 'd' or 'u', ungrouped: the lane carries the record
      local record = string.sub(lane, 3)
      if kind == 'r' then
        record = counted(record)
        retried = retried + 1
      elseif kind == 'd' then
        deferred = deferred + 1
      else
        unhandled, started = unhandled + 1, started - 1
        unstarted_in_queue(token)
      end
      local delay = tonumber(ARGV[base + 3]) or 0
      note(record, '', 'p', delay)
      send_back('j:' .. record, delay)
    end
  end
end
table.sort(conc_items, function(x, y) return x.fence > y.fence end)
for _, c in ipairs(conc_items) do conc_end(c.token, c.lane, c.kind, c.pause, c.base) end
if #ended > 0 then redis.call('ZREM', active, unpack(ended)) end
push_lanes(back)
push_lanes(front, true)
if #nexts > 0 then -- one INCRBY for every fence, given out in item order
  local fences = 0
  for _, x in ipairs(nexts) do fences = fences + 1 + #x[3] end
  local fence = redis.call('INCRBY', fence_key, string.format('%d', fences)) - fences
  -- Numbers go to Redis and into tokens as strings made with '%d': Lua's own conversion of a
  -- number (and Redis's of a number argument) prints it as a float, which costs microseconds.
  local leases, deadline = {}, string.format('%d', clock() + ttl)
  for _, x in ipairs(nexts) do
    fence = fence + 1
    x[1] = string.format('%d|', fence) .. x[4]
    leases[#leases + 1] = deadline
    leases[#leases + 1] = x[1]
    fence = fence + #x[3]
  end
  redis.call('ZADD', active, unpack(leases))
  started = started + #nexts
end
local function count(field, by)
  if by ~= 0 then redis.call('HINCRBY', stats, field, string.format('%d', by)) end
end
count('started', started)
if #later > 0 then
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  redis.call('ZADD', delayed, unpack(later))
  local earliest = later[1]
  for j = 3, #later, 2 do earliest = math.min(earliest, later[j]) end
  if #first == 0 or earliest < tonumber(first[2]) then
    -- SPUBLISH: on a cluster only the queue's shard hears it; before Redis 7.0, PUBLISH.
    if type(redis.pcall('SPUBLISH', delayed, earliest)) == 'table' then redis.call('PUBLISH', delayed, earliest) end
  end
end
count('completed', completed)
count('failed', failed)
count('retried', retried)
count('deferred', deferred)
count('unhandled', unhandled)
count('halted', halted)
count('groups', -emptied)
if kept_done > 0 then -- entries of completed jobs that ran out (one re-enqueued since keeps its own)
  local gone_ids = redis.call('ZRANGEBYSCORE', prefix .. 'done', '-inf', clock(), 'LIMIT', 0, kept_done + 10)
  for _, id in ipairs(gone_ids) do
    local entry = redis.call('HGET', prefix .. 'jobs', id)
    if entry and (string.sub(entry, 1, 1) == 'c' or string.sub(entry, 1, 1) == 'k') then redis.call('HDEL', prefix .. 'jobs', id) end
  end
  if #gone_ids > 0 then redis.call('ZREM', prefix .. 'done', unpack(gone_ids)) end
end
return done()
