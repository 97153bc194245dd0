-- presence: one instance renews the presence of the visitors whose event
-- streams it holds, for one room, once per period, a few hundred tickets a
-- call (rules::renew_every). ARGV[3] = the epoch the tickets are of, ARGV[4..] =
-- ticket ids. In an open room a renewal writes only the `seen` scores
-- (`ZADD XX GT`, a thousand at a time: no ticket record is read; the
-- backend sends a few hundred ids a call, so no call holds Redis long), then
-- looks the same ids up in `away` (each lane's) and brings back those whose
-- visitor returned. Before opening the pre-queue has no scores: the records
-- are touched.
-- Returns {r = 'ok', away_grace_ms, back = n} | {r = 'noroom'}
if not room({'open', 'away_grace_ms'}) then return reply({r = 'noroom'}) end
local back = 0
if ARGV[3] == EPOCH and #ARGV >= 4 then
  if M['open'] ~= '1' then
    for i = 4, #ARGV do
      local t = load_ticket(ARGV[i])
      if t then
        touch(t)
        if t.dirty then save_ticket(t) end
      end
    end
  else
    local CHUNK = 1000
    local now = S(NOW)
    for from = 4, #ARGV, CHUNK do
      local to = math.min(from + CHUNK - 1, #ARGV)
      local zadd, ids = {'ZADD', K('seen'), 'XX', 'GT'}, {}
      for i = from, to do
        zadd[#zadd + 1] = now
        zadd[#zadd + 1] = ARGV[i]
        ids[#ids + 1] = ARGV[i]
      end
      redis.call(unpack(zadd))
      for l = 0, LANES - 1 do
        local away_l = LK('away', l)
        -- Most lanes have nobody away most of the time.
        if l == 0 or redis.call('EXISTS', away_l) == 1 then
          local away = redis.call('ZMSCORE', away_l, unpack(ids))
          for i, score in ipairs(away) do
            if score then
              local t = load_ticket(ids[i])
              if t and t.state == AWAY then
                touch(t)
                save_ticket(t)
                back = back + 1
              end
            end
          end
        end
      end
    end
  end
end
return reply({r = 'ok', away_grace_ms = n('away_grace_ms'), back = back})
