-- Takes a distributed lock (jobrt::lock_service, runtime/src/lock/redis_lock.cpp), for one caller
-- or for several waiters of one service that asked at once (FIFO: one call queues them all).
-- KEYS[1] the lock (string: owner token, PX TTL)   KEYS[2] its fence counter (never expires)
-- FIFO order: KEYS[3] the queue (zset: token -> arrival). A FIFO waiter's token carries its
-- ticket: "<random>:<wait ms>:<ttl ms>"; the ticket is valid until its arrival (in ms) plus the
-- wait, and a hand-off sets the lock to the token with that TTL. Nothing else is kept per waiter.
-- 'any' order: KEYS[3] the services whose waiters failed an attempt (hash: service id ->
-- '<since>:<until>', server ms: since its first failure, until the end of its longest wait; the
-- key lives as long as its longest mark). A lock set to '~<service id>' is reserved for that
-- service's waiters (see lock_release.lua): free for them, taken for the rest.
-- (Only the keys of the caller's order are passed: fewer arguments to send, all the keys it touches declared.)
-- ARGV[1] ttl ms  ARGV[2] 'any' or 'fifo'  ARGV[3] '0': the callers do not wait; else they do
-- (FIFO: '1', they queue tickets; any: the ms they still wait, for which KEYS[3] marks them)
-- ARGV[4] the callers' service id, then the callers' tokens, in arrival order
-- Returns per caller: 1 and the fence when it holds the lock (also when it already did: a resent
-- call, or a FIFO hand-off whose message was lost), else 0 and the ms to wait for: the holder's
-- PTTL, or the ticket of the queue's head; -1 when unknown.
--
-- Arrival: the queue's scores are the server's time in µs, and a call's callers follow each
-- other 1 apart (after the last ticket when that is later): they keep their order, and whoever
-- calls after this script ran comes after all of them.
local ttl, fifo, waits, service = ARGV[1], ARGV[2] == 'fifo', ARGV[3] ~= '0', ARGV[4]

-- The server's time, asked for only when needed ('any' order only for a fence).
local t, now_ms = nil, nil
local function clock()
  if not t then
    t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return t
end

-- A fence larger than any before, also after the server lost some or all of its data (a restart
-- from an older snapshot, a failover to a replica that lagged): never below the server's time in
-- microseconds, beyond every fence handed out earlier unless more than a million a second were.
local function next_fence()
  local f = redis.call('INCR', KEYS[2])
  clock()
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if f < floor then
    f = floor
    redis.call('SET', KEYS[2], string.format('%.0f', f))
  end
  return f
end

local current = redis.call('GET', KEYS[1])
if not fifo and current == '~' .. service then current = false end -- reserved for these callers

-- The queue's live head (FIFO), looked up only when the lock is free: tickets whose waiter gave
-- up without leaving (a dead process) are dropped there.
local head, head_deadline, head_known = nil, nil, false
local function find_head()
  head_known = true
  clock()
  while true do
    local h = redis.call('ZRANGE', KEYS[3], '0', '0', 'WITHSCORES')
    if not h[1] then return end
    local wait = tonumber(string.match(h[1], ':(%d+):%d+$'))
    local deadline = wait and math.floor(tonumber(h[2]) / 1000) + wait
    if deadline and deadline > now_ms then
      head, head_deadline = h[1], deadline
      return
    end
    redis.call('ZREM', KEYS[3], h[1])
  end
end

local out, behind = {}, {} -- behind: where the backstops of the callers that failed are in out
local arrivals, longest = {}, 0
local arrival = nil
local pttl = nil
for i = 5, #ARGV do
  local token = ARGV[i]
  if current == token then
    -- Its lease counts from this answer: a hand-off it learns of only now (its message or the
    -- release's reply lost) may have been set long ago.
    redis.call('PEXPIRE', KEYS[1], ttl)
    out[#out + 1] = 1
    out[#out + 1] = tonumber(redis.call('GET', KEYS[2])) or next_fence() -- (the counter evicted: a new one)
  else
    if fifo and not current and not head_known then find_head() end
    if not current and (head == nil or head == token) then
      redis.call('SET', KEYS[1], token, 'PX', ttl)
      current = token
      if not fifo then redis.call('HDEL', KEYS[3], service) end -- its service waits no more
      if head then
        redis.call('ZREM', KEYS[3], head)
        head, head_deadline = nil, nil
      end
      pttl = nil
      -- Callers before it in this call that queued behind the head it was: their backstop is
      -- its TTL now, not the head's ticket.
      for _, at in ipairs(behind) do
        if out[at] < 0 or out[at] > tonumber(ttl) then out[at] = tonumber(ttl) end
      end
      out[#out + 1] = 1
      out[#out + 1] = next_fence()
    else
      if fifo and waits then
        if not arrival then
          clock()
          arrival = tonumber(t[1]) * 1000000 + tonumber(t[2])
          local last = redis.call('ZRANGE', KEYS[3], '-1', '-1', 'WITHSCORES')[2]
          if last and tonumber(last) >= arrival then arrival = tonumber(last) + 1 end
        else
          arrival = arrival + 1
        end
        -- NX: a waiter that asks again keeps its place.
        arrivals[#arrivals + 1] = string.format('%d', arrival)
        arrivals[#arrivals + 1] = token
        longest = math.max(longest, tonumber(string.match(token, ':(%d+):%d+$')) or 0)
      end
      if not pttl then
        pttl = redis.call('PTTL', KEYS[1])
        if pttl < 0 and head_deadline then pttl = head_deadline - now_ms end
        if not fifo and waits then
          -- Tells a holder's service that handed the lock on within itself for long that others
          -- wait, for as long as they do: a reservation (lock_release.lua) never outlasts them.
          -- One mark per service, kept as long as its longest waiter waits and dated from when its
          -- service began to wait (a mark whose wait was over starts again).
          clock()
          local since, till = now_ms, now_ms + tonumber(ARGV[3])
          local old_since, old_till = string.match(redis.call('HGET', KEYS[3], service) or '', '^(%d+):(%d+)$')
          if old_till and tonumber(old_till) > now_ms then
            since, till = tonumber(old_since), math.max(till, tonumber(old_till))
          end
          redis.call('HSET', KEYS[3], service, string.format('%d:%d', since, till))
          if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[3], ARGV[3]) end
        end
      end
      out[#out + 1] = 0
      out[#out + 1] = pttl
      behind[#behind + 1] = #out
    end
  end
end

if #arrivals > 0 then
  redis.call('ZADD', KEYS[3], 'NX', unpack(arrivals))
  -- The queue outlives its longest ticket (never shortened by a caller that waits less).
  local keep = longest + 60000
  if redis.call('PTTL', KEYS[3]) < keep then redis.call('PEXPIRE', KEYS[3], string.format('%d', keep)) end
end
return out
