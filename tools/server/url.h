/* The URL unescape step of both HTTP servers (osprey serve, osprey router), given to libmicrohttpd as
 * MHD_OPTION_UNESCAPE_CALLBACK. */
#ifndef OSP_SERVER_URL_H
#define OSP_SERVER_URL_H

#include <microhttpd.h>
#include <stddef.h>

/* Unescapes s in place for the path and the query arguments: %XX with two hex digits becomes its byte,
 * as libmicrohttpd's own MHD_http_unescape does (a % not followed by two hex digits stays), except %00,
 * which stays the three characters it was: a decoded NUL would end the C string every route compares
 * ("/v1/models%00x" routed as /v1/models; found by a fresh-user review), and kept it matches no route.
 * "%2500" therefore arrives as the same "%00" text (both are no route; no route reads query arguments).
 * Returns the new length. cls and c are unused (the callback's signature). */
size_t srv_unescape(void *cls, struct MHD_Connection *c, char *s);

#endif
