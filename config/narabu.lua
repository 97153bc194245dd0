-- Narabu's gate for HAProxy: the `lua.narabu-gate` action asks Narabu's
-- `GET /gate/{room}` about each request to the protected site, as nginx's
-- auth_request does, with the HTTP client built into HAProxy (2.5 and
-- later): nothing to install beyond HAProxy itself.
--
--   global
--       lua-load /etc/haproxy/narabu.lua
--   frontend site
--       http-request lua.narabu-gate http://127.0.0.1:8080/gate/sale
--
-- It sets, for the rules after it (config/haproxy.cfg shows them):
--   txn.narabu_admitted  the gate answered 204: let the request through
--   txn.narabu_queue     the gate answered 401: redirect here (the queue
--                        page, with the original URI as its return path)
--   txn.narabu_blocked   the gate answered 403: a traffic rule of the room
--                        blocks the request
--   txn.narabu_pass      a pass cookie the gate sets (the signed pass
--                        asked for with ?pass=1, or the fail-open pass
--                        while on_backend_error = "open"): hand it to the
--                        browser; txn.narabu_pass_more a second one
-- None of the first three is set when Narabu cannot be asked or answers
-- anything else (an unknown room): haproxy.cfg refuses the request then.

-- A header's values in order. HAProxy's request header tables count from
-- 0, its HTTP client's from 1: sort whatever numbers there are.
local function values(list)
    local keys = {}
    for k in pairs(list or {}) do
        if type(k) == "number" then
            keys[#keys + 1] = k
        end
    end
    table.sort(keys)
    local out = {}
    for i, k in ipairs(keys) do
        out[i] = list[k]
    end
    return out
end

core.register_action("narabu-gate", { "http-req" }, function(txn, gate)
    local incoming = txn.http:req_get_headers()
    -- What the visitor asked for, set here (never the visitor's own
    -- copies): the return path, and what a room's traffic rules match on.
    local headers = {
        ["x-original-uri"] = { txn.sf:pathq() },
        ["x-forwarded-method"] = { txn.sf:method() },
        ["x-forwarded-for"] = { txn.sf:src() },
    }
    local host = values(incoming["host"])[1]
    if host then
        headers["x-forwarded-host"] = { host }
    end
    local agent = values(incoming["user-agent"])[1]
    if agent then
        headers["user-agent"] = { agent }
    end
    -- The visitor's ticket: the room cookie, or a bearer token from an app.
    local cookies = values(incoming["cookie"])
    if #cookies > 0 then
        headers["cookie"] = { table.concat(cookies, "; ") }
    end
    local authorization = values(incoming["authorization"])[1]
    if authorization then
        headers["authorization"] = { authorization }
    end

    local ok, answer = pcall(function()
        return core.httpclient():get({ url = gate, headers = headers, timeout = 5000 })
    end)
    if not ok or answer == nil then
        core.Warning("narabu-gate: cannot ask " .. gate)
        return
    end
    local answered = answer.headers or {}
    if answer.status == 204 then
        txn:set_var("txn.narabu_admitted", true)
        -- The signed pass (asked for with ?pass=1) comes first, then the
        -- fail-open pass: hand both on.
        local cookies = values(answered["set-cookie"])
        if cookies[1] then
            txn:set_var("txn.narabu_pass", cookies[1])
        end
        if cookies[2] then
            txn:set_var("txn.narabu_pass_more", cookies[2])
        end
    elseif answer.status == 403 then
        -- A traffic rule of the room blocks the request.
        txn:set_var("txn.narabu_blocked", true)
    elseif answer.status == 401 then
        local queue = values(answered["x-narabu-queue"])[1]
        if queue then
            txn:set_var("txn.narabu_queue", queue)
        end
    else
        core.Warning("narabu-gate: " .. gate .. " answered " .. tostring(answer.status))
    end
end, 1)
