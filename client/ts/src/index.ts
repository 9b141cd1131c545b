// @crypto-offload/client: the crypto-offload client for web pages, React Native and Node.
// Node's HTTP/2 transports are in "@crypto-offload/client/node"; this entry imports nothing of
// Node, so bundlers for browsers and React Native take it as it is.
export {
  OffloadClient,
  createOffloadClient,
  createFetchTransport,
  kMaxBatchItems,
  kMiB,
} from "./client.js";
export type {
  BoxOpenRequest,
  BoxSealRequest,
  CallOptions,
  ClientStats,
  DeriveMemoOptions,
  DeriveRequest,
  DeriveResult,
  FetchTransportOptions,
  OffloadClientOptions,
  OpenMemoOptions,
  OpenRequest,
  OpenResult,
  RetryOptions,
  SealRequest,
  ServiceClient,
  SignRequest,
  TokenProvider,
  VerifyMemoOptions,
  VerifyRequest,
  VerifyResult,
} from "./client.js";
export type { CryptoProvider } from "./digest.js";
export { platformCrypto } from "./digest.js";
export type { MemoStats } from "./memo.js";
export { isKeyRefusal, isRetryable, serverRetryDelayMs } from "./errors.js";
// What callers need of connect-es, from the same copy the client uses.
export { Code, ConnectError } from "@connectrpc/connect";
export type { Transport } from "@connectrpc/connect";
// The API's enums and services, so that callers need no generated code of their own.
export { KeyService, KeyType, KeyState, KeyVersionState } from "./gen/offload/v1/keys_pb.js";
export type { KeyInfo } from "./gen/offload/v1/keys_pb.js";
export { DeriveOutput, X25519Service } from "./gen/offload/v1/x25519_pb.js";
export { AeadService } from "./gen/offload/v1/aead_pb.js";
export type { AeadSealResponse, AeadRewrapResponse } from "./gen/offload/v1/aead_pb.js";
export { Ed25519Service } from "./gen/offload/v1/ed25519_pb.js";
export type { SignResponse } from "./gen/offload/v1/ed25519_pb.js";
export { BoxService } from "./gen/offload/v1/box_pb.js";
export type { BoxOpenResponse, BoxSealResponse } from "./gen/offload/v1/box_pb.js";
export { RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";
export { StatusSchema } from "./gen/google/rpc/status_pb.js";
