#include "service/api/method_table.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "service/api/methods.h"
#include "service/api/secret_fields.h"
#include "service/ops/retry_delay.h"

namespace offload::api {
namespace {

using google::protobuf::Message;
using ops::Operations;

template <typename Request, typename Response>
Method Make(absl::string_view service, absl::string_view name, const Traits& traits, bool batch,
            std::function<void(const Request&, Response*, Operations::Done, Operations::Alive)>
                fn) {
  Method m;
  m.service = std::string(service);
  m.method = std::string(name);
  m.path = absl::StrCat("/", service, "/", name);
  m.batch = batch;
  m.operation = std::string(traits.operation);
  m.admin = traits.admin;
  m.uses_key = traits.uses_key;
  m.immutable = traits.immutable;
  // Key lifecycle calls are audited one by one; data-plane calls that name keys when
  // --audit_data_plane draws them.
  m.key_lifecycle = service == kKeyService && traits.admin;
  m.data_plane = service != kKeyService && traits.uses_key;
  m.request_prototype = &Request::default_instance();
  m.response_prototype = &Response::default_instance();
  m.secret_request = HasSecretFields(*Request::descriptor());
  m.secret_response = HasSecretFields(*Response::descriptor());
  m.call = [fn = std::move(fn)](const Message& request, Message* response,
                                Operations::Done done, Operations::Alive alive) {
    fn(static_cast<const Request&>(request), static_cast<Response*>(response), std::move(done),
       std::move(alive));
  };
  return m;
}

// Method::from_memo over an Operations `from_memo` step: a hit or an error completes the call;
// a miss keeps its probe (what the lookup found) for Method::fresh.
template <typename Request, typename Response, typename ProbeT>
auto FromMemo(const Operations* ops,
              bool (Operations::*from_memo)(const Request&, Response*, ProbeT*, absl::Status*)
                  const) {
  return [ops, from_memo](const Message& q, Message* r, Method::Probe* probe,
                          absl::Status* status) {
    ProbeT p;  // on the stack: a hit (the common case) allocates nothing for it
    if ((ops->*from_memo)(static_cast<const Request&>(q), static_cast<Response*>(r), &p,
                          status)) {
      return true;
    }
    *probe = std::make_shared<ProbeT>(std::move(p));
    return false;
  };
}

// A single-item operation split in two (see Method::from_memo): `from_memo` may answer on a
// transport thread; `fresh` runs on a worker with the lookup's probe.
template <typename Request, typename Response, typename ProbeT>
Method MemoFirst(const Operations* ops, absl::string_view service, absl::string_view name,
                 const Traits& traits, bool (Operations::*from_memo)(const Request&, Response*, ProbeT*,
                                               absl::Status*) const,
                 absl::Status (Operations::*fresh)(const Request&, const ProbeT&,
                                                   Response*) const) {
  Method m = Make<Request, Response>(
      service, name, traits, false,
      [ops, from_memo, fresh](const Request& q, Response* r, Operations::Done done,
                              Operations::Alive) {
        ProbeT probe;
        absl::Status status;
        if ((ops->*from_memo)(q, r, &probe, &status)) return std::move(done)(std::move(status));
        std::move(done)((ops->*fresh)(q, probe, r));
      });
  m.from_memo = FromMemo(ops, from_memo);
  m.fresh = [ops, fresh](const Message& q, Message* r, Method::Probe probe, Operations::Done done,
                         Operations::Alive) {
    std::move(done)((ops->*fresh)(static_cast<const Request&>(q),
                                  *static_cast<const ProbeT*>(probe.get()),
                                  static_cast<Response*>(r)));
  };
  return m;
}

// A batch split in two (BatchVerify): leading memo hits on the calling thread, the rest on the
// pool.
template <typename Request, typename Response, typename ProbeT>
Method BatchMemoFirst(const Operations* ops, absl::string_view service, absl::string_view name,
                      const Traits& traits, bool (Operations::*from_memo)(const Request&, Response*, ProbeT*,
                                                    absl::Status*) const,
                      void (Operations::*fresh)(const Request&, const ProbeT&, Response*,
                                                Operations::Done, Operations::Alive) const) {
  Method m = Make<Request, Response>(
      service, name, traits, true,
      [ops, from_memo, fresh](const Request& q, Response* r, Operations::Done done,
                              Operations::Alive alive) {
        ProbeT probe;
        absl::Status status;
        if ((ops->*from_memo)(q, r, &probe, &status)) return std::move(done)(std::move(status));
        (ops->*fresh)(q, probe, r, std::move(done), std::move(alive));
      });
  m.from_memo = FromMemo(ops, from_memo);
  m.fresh = [ops, fresh](const Message& q, Message* r, Method::Probe probe, Operations::Done done,
                         Operations::Alive alive) {
    (ops->*fresh)(static_cast<const Request&>(q), *static_cast<const ProbeT*>(probe.get()),
                  static_cast<Response*>(r), std::move(done), std::move(alive));
  };
  return m;
}

// A single-item operation: runs here, then reports.
template <typename Request, typename Response>
Method Unary(const Operations* ops, absl::string_view service, absl::string_view name,
             const Traits& traits,
             absl::Status (Operations::*op)(const Request&, Response*) const) {
  return Make<Request, Response>(service, name, traits, false,
                                 [ops, op](const Request& q, Response* r, Operations::Done done,
                                           Operations::Alive) { std::move(done)((ops->*op)(q, r));
                                 });
}

template <typename Request, typename Response>
Method Batch(const Operations* ops, absl::string_view service, absl::string_view name,
             const Traits& traits,
             void (Operations::*op)(const Request&, Response*, Operations::Done,
                                    Operations::Alive) const) {
  return Make<Request, Response>(service, name, traits, true,
                                 [ops, op](const Request& q, Response* r, Operations::Done done,
                                           Operations::Alive alive) {
                                   (ops->*op)(q, r, std::move(done), std::move(alive));
                                 });
}

// A key call's answer: an Unavailable one (the key store cannot be reached, whose detail the
// store logged; a key the server cannot read for now) says when to try again, as the server's
// other refusals do (ops/retry_delay.h).
absl::Status KeyCallStatus(absl::Status s) {
  if (!absl::IsUnavailable(s) || ops::RetryDelayOf(s).has_value()) return s;
  return ops::WithRetryDelay(std::move(s), ops::JitteredRetryDelay(ops::kDefaultRetryDelay));
}

// Builds the table's entries from api::ForEachMethod.
struct TableBuilder {
  const Operations* ops;
  keys::KeyManager* keys;
  std::vector<Method>* methods;

  template <typename Request, typename Response>
  void Keys(absl::string_view name, const Traits& traits, KeyFn<Request, Response> fn) {
    methods->push_back(Make<Request, Response>(
        kKeyService, name, traits, false,
        [k = keys, fn](const Request& q, Response* r, Operations::Done done, Operations::Alive) {
          std::move(done)(KeyCallStatus(fn(k, q, r)));
        }));
  }
  template <typename Request, typename Response>
  void Unary(absl::string_view service, absl::string_view name, const Traits& traits,
             absl::Status (Operations::*op)(const Request&, Response*) const) {
    methods->push_back(api::Unary(ops, service, name, traits, op));
  }
  template <typename Request, typename Response>
  void Batch(absl::string_view service, absl::string_view name, const Traits& traits,
             void (Operations::*op)(const Request&, Response*, Operations::Done,
                                    Operations::Alive) const) {
    methods->push_back(api::Batch(ops, service, name, traits, op));
  }
  template <typename FromMemoFn, typename FreshFn>
  void MemoFirst(absl::string_view service, absl::string_view name, const Traits& traits,
                 FromMemoFn from_memo, FreshFn fresh) {
    methods->push_back(api::MemoFirst(ops, service, name, traits, from_memo, fresh));
  }
  template <typename FromMemoFn, typename FreshFn>
  void BatchMemoFirst(absl::string_view service, absl::string_view name, const Traits& traits,
                      FromMemoFn from_memo, FreshFn fresh) {
    methods->push_back(api::BatchMemoFirst(ops, service, name, traits, from_memo, fresh));
  }
  void AeadOpen(absl::string_view service, absl::string_view name, const Traits& traits) {
    methods->push_back(api::MemoFirst(ops, service, name, traits, &Operations::AeadOpenFromMemo,
                                      &Operations::AeadOpenFresh));
    methods->back().from_memo_shared = [o = ops](const Operations::OpenRequestView& q,
                                                 Operations::OpenResult* result,
                                                 Method::Probe* probe, absl::Status* status) {
      Operations::OpenProbe p;
      if (o->AeadOpenFromMemoShared(q, result, &p, status)) return true;
      *probe = std::make_shared<Operations::OpenProbe>(std::move(p));
      return false;
    };
    methods->back().fresh_shared = [o = ops](const Operations::OpenRequestView& q,
                                             std::string* owner, const Method::Probe& probe,
                                             Operations::OpenResult* result) {
      return o->AeadOpenFreshShared(
          q, owner, *static_cast<const Operations::OpenProbe*>(probe.get()), result);
    };
  }
};

}  // namespace

MethodTable::MethodTable(const Operations* ops, keys::KeyManager* keys) {
  TableBuilder builder{ops, keys, &methods_};
  ForEachMethod(builder);

  // The proto is the contract: every entry names one of its methods, with its types, and says
  // what its options say.
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (Method& m : methods_) {
    const google::protobuf::MethodDescriptor* d =
        pool->FindMethodByName(absl::StrCat(m.service, ".", m.method));
    if (d == nullptr || d->input_type() != m.request_prototype->GetDescriptor() ||
        d->output_type() != m.response_prototype->GetDescriptor()) {
      // Our own invariant (a programming error), caught by every test that builds a table.
      std::fprintf(stderr, "method table: %s is not in the proto with these types\n",
                   m.path.c_str());
      std::abort();
    }
    m.no_side_effects =
        d->options().idempotency_level() == google::protobuf::MethodOptions::NO_SIDE_EFFECTS;
  }
  for (const Method& m : methods_) by_path_[m.path] = &m;
}

const Method* MethodTable::Find(absl::string_view path) const {
  auto it = by_path_.find(path);
  return it == by_path_.end() ? nullptr : it->second;
}

auth::OperationMap PolicyOperations() {
  const MethodTable table(/*operations=*/nullptr, /*keys=*/nullptr);
  auth::OperationMap operations;
  for (const Method& m : table.methods()) {
    operations[m.path] = auth::Operation{m.operation, m.admin, m.uses_key};
  }
  return operations;
}

}  // namespace offload::api
