// The attention passes of kind kGatV2 (GATv2Conv): forward, target-side and source-side
// backward, instantiated for this kind alone so that each kind compiles in
// its own translation unit.
#include "host.cuh"

namespace gnnio {
namespace attention {

template struct KindOps<kGatV2>;

}  // namespace attention
}  // namespace gnnio
